"""`scorekit check PATH` (issue 33, item 6): how a folder will be served, the start-up log's lines, and its probes'
scores through the served path against a reference written apart, for every family scorekit serves; a divergence
is one stderr line per probe and exit 1. And the refusal rule: a folder that fits no kind, or a head module
scorekit cannot run, is one line at start-up naming it, never served with a guess.

One check runs as a process, end to end; the rest call :func:`scorekit.cli.check.check` in-process (it leaves the
logging configuration alone, unlike the command), on tiny random models."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import CrossEncoder
from sentence_transformers.base.modules import Dense, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

from scorekit.cli import parse
from scorekit.cli import probes as probes_module
from scorekit.cli.check import apart, check
from scorekit.cli.probes import Row
from scorekit.models import default_model_path, detect
from scorekit.models.rerank_template import TEMPLATE_FILE
from scorekit.settings import ModelSpec
from tests.cli.conftest import one_line_error, scorekit
from tests.e2e.test_embedding_options import build_bi_encoder
from tests.live import free_port
from tests.tiny_models import (
    build_causal_lm,
    build_gemma_reranker,
    build_jina_reranker,
    build_mxbai_reranker,
    build_pylate_colbert,
    build_qwen3_reranker,
    build_sparse_encoder,
    build_stanford_colbert,
)

WIDTH = 32


def _backbone(folder: Path) -> Path:
    torch.manual_seed(0)
    config = BertConfig(hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


def _modular(tmp: Path, *head: torch.nn.Module) -> Path:
    """A sentence-transformers 6 CrossEncoder saved as a backbone and ``head`` after it."""
    transformer = Transformer(str(_backbone(tmp / "backbone")), transformer_task="feature-extraction")
    CrossEncoder(modules=[transformer, *head], device="cpu").save(str(tmp / "modular"))  # type: ignore[arg-type]
    return tmp / "modular"


def _plain_minilm(tmp: Path) -> Path:
    """The embedded MiniLM without sentence-transformers' files: a plain encoder, pooled by its tokens' mean."""
    folder = Path(shutil.copytree(default_model_path(), tmp / "plain-minilm"))
    for name in ("modules.json", "config_sentence_transformers.json"):
        (folder / name).unlink()
    shutil.rmtree(folder / "1_Pooling")
    return folder


def _templated(tmp: Path) -> Path:
    """A causal LM with a reranker template beside its weights (the MiniLM tokenizer has "yes" and "no")."""
    folder = build_causal_lm(tmp / "my-lm")
    template = {"segments": ["question: {query}", " passage: {document}", " relevant?"], "labels": ["no", "yes"]}
    (folder / TEMPLATE_FILE).write_text(json.dumps(template))
    return folder


# Each family scorekit serves: a folder of it, and the words its kind's line gives.
FAMILIES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "cross-encoder": (lambda tmp: _st_saved(tmp, saved=False), "architectures name BertForSequenceClassification"),
    "cross-encoder saved by sentence-transformers": (
        lambda tmp: _st_saved(tmp, saved=True),
        "architectures name BertForSequenceClassification",
    ),
    "modular CrossEncoder": (
        lambda tmp: _modular(tmp, Pooling(WIDTH, pooling_mode="cls"), Dense(WIDTH, 1, module_output_name="scores")),
        "modules.json lists Transformer, Pooling, Dense (a CrossEncoder's head)",
    ),
    "bi-encoder": (lambda tmp: Path(default_model_path()), "modules.json lists Transformer, Pooling, Normalize"),
    "plain bi-encoder": (_plain_minilm, "config.json's architectures name BertModel"),
    # Saved query and document prompts, and a default one that neither side of a pair gets.
    "bi-encoder with prompts": (lambda tmp: build_bi_encoder(tmp / "prompted"), "modules.json lists Transformer"),
    "SPLADE": (lambda tmp: build_sparse_encoder(tmp / "splade"), "(a SparseEncoder)"),
    "PyLate ColBERT": (lambda tmp: build_pylate_colbert(tmp / "pylate"), "late-interaction"),
    "Stanford ColBERT": (lambda tmp: build_stanford_colbert(tmp / "stanford"), "late-interaction"),
    "Qwen3-Reranker": (lambda tmp: build_qwen3_reranker(tmp / "tiny-Qwen3-Reranker"), "'rerank' in its name"),
    "bge-reranker-v2-gemma": (
        lambda tmp: build_gemma_reranker(tmp / "tiny-bge-reranker-v2-gemma"),
        "'rerank' in its name",
    ),
    "mxbai-rerank-v2": (lambda tmp: build_mxbai_reranker(tmp / "tiny-mxbai-rerank-v2"), "'rerank' in its name"),
    "causal LM with a template file": (_templated, f"with {TEMPLATE_FILE} beside its weights"),
    "jina-reranker-v3": (lambda tmp: build_jina_reranker(tmp / "jina"), "architectures name JinaForRanking"),
    "causal LM": (lambda tmp: build_causal_lm(tmp / "lm"), "architectures name LlamaForCausalLM"),
}


def _st_saved(tmp: Path, *, saved: bool) -> Path:
    from tests.tiny_models import build_cross_encoder

    folder = build_cross_encoder(tmp / "cross-encoder")
    if not saved:
        return folder
    CrossEncoder(str(folder), device="cpu").save(str(tmp / "saved"))  # config_sentence_transformers.json and all
    return tmp / "saved"


def _checked(capsys: pytest.CaptureFixture[str], folder: Path, **spec: Any) -> tuple[int, list[str], list[str]]:
    """``check`` in-process: its status, and its stdout's and stderr's lines."""
    status = check(ModelSpec(str(folder), **spec))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_s_check_passes(family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build, why = FAMILIES[family]
    folder = build(tmp_path)
    capsys.readouterr()  # what building it printed
    status, out, err = _checked(capsys, folder)
    assert (status, err) == (0, []), "\n".join(out + err)
    assert out[0].startswith(f"loaded {folder} (") and why in out[1], out[:5]
    agreed = re.fullmatch(r"(\d+) of \1 probes agree with the reference to 1e-4", out[-1])
    assert agreed is not None and int(agreed.group(1)) >= 8, out


def test_the_check_as_a_process_prints_how_it_serves_and_agrees(cross_encoder_dir: Path) -> None:
    result = scorekit("check", str(cross_encoder_dir))
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    lines = result.stdout.splitlines()
    name = str(cross_encoder_dir)
    assert lines[0].startswith(f"loaded {name} (cross-encoder) on cpu in float32 in ")
    assert lines[1:5] == [
        f"{name}: kind cross-encoder: config.json's architectures name BertForSequenceClassification",
        f"{name}: scores with the default activation torch.nn.modules.activation.Sigmoid (none saved)",
        f"{name}: inputs up to 128 tokens: config.json's max_position_embeddings",
        f"{name}: runtime torch, on cpu in float32",
    ]
    assert lines[6].split() == ["probe", "served", "reference", "difference"]
    assert lines[-1] == "9 of 9 probes agree with the reference to 1e-4"


def test_the_lines_are_the_start_up_log_s(
    cross_encoder_dir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """What the check prints first is what load_spec (serve's load) logged, line for line."""
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        status, out, _ = _checked(capsys, cross_encoder_dir, max_model_len=64)
    logged = [record.getMessage() for record in caplog.records if record.name == "scorekit.models"]
    assert status == 0 and logged[-5:] == out[:5], (logged, out)
    assert out[3].endswith(
        ": inputs up to 64 tokens: --max-model-len (the model's own: 128 tokens, config.json's max_position_embeddings)"
    )


def test_a_divergence_is_one_line_per_probe_and_exit_1(
    cross_encoder_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served = probes_module._served

    def off(plan: Any, forward: Any) -> Any:
        answer = served(plan, forward)
        return dataclasses.replace(answer, scores=[score + 1e-3 for score in answer.scores])

    monkeypatch.setattr(probes_module, "_served", off)
    status, out, err = _checked(capsys, cross_encoder_dir)
    assert status == 1 and len(err) == 9, err
    assert err[0].startswith("scorekit check: what is the capital o... | Paris is the capital ...: served ")
    assert all(line.endswith(": 1.0e-03 apart, over 1e-4") for line in err), err
    assert out[-1] == "0 of 9 probes agree with the reference to 1e-4"


def test_the_tolerance_is_inclusive_and_a_nan_is_apart() -> None:
    rows = [Row("at", 0.0, 1e-4), Row("over", 0.0, 1.01e-4), Row("nan", math.nan, 0.5), Row("same", 0.25, 0.25)]
    assert [row.probe for row in apart(rows)] == ["over", "nan"]


def test_a_folder_that_cannot_be_loaded_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exited:
        check(ModelSpec(str(tmp_path / "empty")))
    _, err = capsys.readouterr()
    assert exited.value.code == 2
    assert err.splitlines() == [
        f"scorekit check: error: Model '{tmp_path / 'empty'}' could not be loaded: it has no config.json"
        " (--debug shows the traceback)"
    ]
    with pytest.raises(SystemExit) as exited:
        parse(["check", str(tmp_path), "--dtype", "int8"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("scorekit check: error: argument --dtype: invalid choice: 'int8'")


def test_without_sentence_transformers_a_sentence_transformers_folder_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "sentence_transformers" else find_spec(name)
    )
    with pytest.raises(SystemExit) as exited:
        check(ModelSpec(default_model_path()))
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "scorekit check: error: sentence-transformers is needed to check a Sentence-Transformers model:"
        " pip install 'scorekit[check]' (--debug shows the traceback)"
    )


# The refusal rule, at `scorekit serve`'s start-up


def test_a_module_it_cannot_run_after_a_transformer_is_refused_naming_it(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(default_model_path(), tmp_path / "custom-head"))
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Custom", "type": "my_package.heads.Custom"})
    (folder / "modules.json").write_text(json.dumps(modules))
    line = one_line_error(scorekit("serve", str(folder), "--port", str(free_port())), 1)
    assert line == (
        f"scorekit: error: Model '{folder}' has a Custom module, which the bi-encoder cannot run"
        " (--debug shows the traceback)"
    )


def test_a_folder_with_no_config_and_no_modules_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "weights-only"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    line = one_line_error(scorekit("serve", str(folder), "--port", str(free_port())), 1)
    assert line == (
        f"scorekit: error: Model '{folder}' could not be loaded: it has no config.json (--debug shows the traceback)"
    )


def test_architectures_of_no_kind_are_refused(tmp_path: Path) -> None:
    """In-process, as serve's load detects: a masked LM with no modules.json fits no kind (a modular CrossEncoder
    whose head holds a module scorekit cannot run: tests/models/test_modular_cross_encoder.py)."""
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=2)).save_pretrained(
        tmp_path / "masked"
    )
    with pytest.raises(ValueError, match=r"fits no kind scorekit serves: config\.json's architectures name "):
        detect(str(tmp_path / "masked"))
    assert detect(default_model_path()).kind == "bi-encoder"
