"""sentence-transformers' modular CrossEncoder (issue 33, item 1): a backbone saved with the head modules after it
(the Ettin rerankers' layout: Pooling -> Dense -> LayerNorm -> Dense writing ``scores``), detected from
config_sentence_transformers.json and modules.json and served as ``CrossEncoder(path).predict`` scores it, to
1e-5, for every head module sentence-transformers ships for cross-encoders (Pooling in each single mode, Dense
with its activation and residual, LayerNorm, Normalize, Dropout), through the backend and a served /rerank."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from sentence_transformers import CrossEncoder
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Dropout, LayerNorm, Pooling
from transformers import AutoTokenizer, BertConfig, BertModel

from scorekit.app import create_app
from scorekit.models import CrossEncoderBackend, default_model_path, detect_kind, load_backend, load_spec
from scorekit.models.st_head import ModularCrossEncoder
from scorekit.settings import ModelSpec, Settings
from tests.live import serve

PAIRS = [
    ("what is the capital of france", "Paris is the capital of France."),
    ("what is the capital of france", "The mitochondria is the powerhouse of the cell."),
    ("how do plants make food", "Plants make food by photosynthesis, from light, water and air, in their leaves."),
    ("how do plants make food", "Rain."),
]
WIDTH = 32


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("backbone")
    torch.manual_seed(0)
    config = BertConfig(hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


def _saved(backbone: Path, folder: Path, head: list[torch.nn.Module], **kwargs: object) -> Path:
    torch.manual_seed(1)
    transformer = Transformer(str(backbone), transformer_task="feature-extraction")
    CrossEncoder(modules=[transformer, *head], device="cpu", **kwargs).save(str(folder))  # type: ignore[arg-type]
    return folder


def _scores(backend: CrossEncoderBackend) -> list[float]:
    queries, documents = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    logits = backend.forward(backend.encode_pairs(queries, documents, None, None))
    return [backend.activation(float(logit)) for logit in logits]


def _predict(folder: Path) -> list[float]:
    return [float(score) for score in CrossEncoder(str(folder), device="cpu").predict(PAIRS)]


HEADS = {
    "ettin": lambda: [
        Pooling(WIDTH, pooling_mode="cls"),
        Dense(WIDTH, WIDTH, activation_function=torch.nn.GELU()),
        LayerNorm(WIDTH),
        Dense(WIDTH, 1, activation_function=torch.nn.Identity(), module_output_name="scores"),
    ],
    "mean-tanh": lambda: [
        Pooling(WIDTH, pooling_mode="mean"),
        Dense(WIDTH, 1, activation_function=torch.nn.Tanh(), module_output_name="scores"),
    ],
    "max-normalize-residual-dropout": lambda: [
        Pooling(WIDTH, pooling_mode="max"),
        Normalize(),
        Dense(WIDTH, 16, activation_function=torch.nn.ReLU(), use_residual=True),
        Dropout(0.1),
        Dense(16, 1, activation_function=torch.nn.Identity(), module_output_name="scores"),
    ],
    "sqrt-len-residual-same-width-prelu": lambda: [
        Pooling(WIDTH, pooling_mode="mean_sqrt_len_tokens"),
        Dense(WIDTH, WIDTH, activation_function=torch.nn.PReLU(init=0.1), use_residual=True),
        Dense(WIDTH, 1, activation_function=torch.nn.Identity(), module_output_name="scores"),
    ],
}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_a_modular_cross_encoder_scores_as_predict(backbone_dir: Path, tmp_path: Path, head: str) -> None:
    folder = _saved(backbone_dir, tmp_path / head, HEADS[head]())
    assert detect_kind(str(folder)) == "cross-encoder"  # the backbone's config.json says BertModel
    backend = load_backend(str(folder))
    assert isinstance(backend, CrossEncoderBackend)
    ours, theirs = _scores(backend), _predict(folder)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=0, atol=1e-5)
    assert max(theirs) - min(theirs) > 1e-4  # the head tells the pairs apart


def test_its_saved_activation_applies_and_a_served_rerank_matches(backbone_dir: Path, tmp_path: Path) -> None:
    folder = _saved(backbone_dir, tmp_path / "identity", HEADS["ettin"](), activation_fn=torch.nn.Identity())
    saved = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert saved["activation_fn"] == "torch.nn.modules.linear.Identity"
    expected = _predict(folder)
    with serve(create_app(Settings.for_model(str(folder), name="ettin"))) as live:
        documents = [d for _, d in PAIRS[:2]]
        status, body = live.json("POST", "/rerank", {"query": PAIRS[0][0], "documents": documents})
        assert status == 200, body
    scores = {item["index"]: item["relevance_score"] for item in body["results"]}
    assert [scores[0], scores[1]] == pytest.approx(expected[:2], abs=1e-5)
    sigmoid = [1 / (1 + math.exp(-score)) for score in expected]
    assert expected != pytest.approx(sigmoid, abs=1e-3)  # the saved Identity, not the default sigmoid


def test_a_head_module_it_cannot_run_and_another_runtime_are_one_line(backbone_dir: Path, tmp_path: Path) -> None:
    folder = _saved(backbone_dir, tmp_path / "unknown", HEADS["mean-tanh"]())
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "my_package.modules.Attention"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="has a Attention module in its CrossEncoder head, which scorekit cannot run"):
        load_backend(str(folder))
    plain = _saved(backbone_dir, tmp_path / "plain", HEADS["mean-tanh"]())
    with pytest.raises(ValueError, match="--runtime onnx cannot run yet: serve it with --runtime torch"):
        load_spec(ModelSpec(str(plain), runtime="onnx"))


def test_the_server_s_weightless_copy_loads_the_head_s_shapes_only(backbone_dir: Path, tmp_path: Path) -> None:
    """With --model-host process the server keeps a copy without weights: the head too is built on the meta
    device, its weights left to the host process."""
    folder = _saved(backbone_dir, tmp_path / "weightless", HEADS["ettin"]())
    backend = load_spec(ModelSpec(str(folder), host="process"), weights=False)
    assert isinstance(backend, CrossEncoderBackend) and backend.max_length > 0
    module = backend._model
    assert isinstance(module, ModularCrossEncoder)
    assert {parameter.device.type for parameter in module.head.parameters()} == {"meta"}
