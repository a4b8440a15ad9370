"""A cross-encoder's saved activation, read where sentence-transformers saves it and applied as it applies it
(issue 33, item 2): ``activation_fn`` in config_sentence_transformers.json (v6), else
``sentence_transformers.activation_fn`` in config.json (v4, v5), else the pre-v4
``sbert_ce_default_activation_function``; any ``torch.`` path; another path only with trust_remote_code, else
sigmoid (with a warning), as ``CrossEncoder(path).predict`` does. Scores equal predict's to 1e-5, through the
backend and through a served /score; a long document's best window is the one that scores best."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import CrossEncoder

from scorekit.app import create_app
from scorekit.models import CrossEncoderBackend, load_backend, load_spec
from scorekit.models.base import Encoded, token_array
from scorekit.models.pairs import Pairing
from scorekit.models.windows import best_windows
from scorekit.settings import ModelSpec, Settings
from tests.live import serve
from tests.tiny_models import build_cross_encoder

PAIRS = [
    ("what is the capital of france", "Paris is the capital of France."),
    ("what is the capital of france", "The mitochondria is the powerhouse of the cell."),
    ("how do plants make food", "Plants make food by photosynthesis, from light, water and air."),
    ("how do plants make food", "Rain."),
]
NEW = "sentence_transformers"  # config.json's dict, v4 and later
OLD = "sbert_ce_default_activation_function"  # config.json's key before v4


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


def _saved(base: Path, folder: Path, **keys: Any) -> Path:
    """A copy of the base model with ``keys`` added to its config.json."""
    shutil.copytree(base, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(keys)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _ours(folder: Path, trust_remote_code: bool = False) -> list[float]:
    backend = load_spec(ModelSpec(str(folder), trust_remote_code=trust_remote_code))
    assert isinstance(backend, CrossEncoderBackend)
    queries, documents = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    logits = backend.forward(backend.encode_pairs(queries, documents, None, None))
    return [backend.activation(float(logit)) for logit in logits]


def _predict(folder: Path, trust_remote_code: bool = False) -> list[float]:
    reference = CrossEncoder(str(folder), device="cpu", trust_remote_code=trust_remote_code)
    return [float(score) for score in reference.predict(PAIRS)]


def _close(ours: list[float], theirs: list[float]) -> None:
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "keys",
    [
        {NEW: {"activation_fn": "torch.nn.modules.activation.Tanh"}},
        {NEW: {"activation_fn": "torch.nn.Softplus", "version": "6.3.0"}},
        {NEW: {"activation_fn": "torch.nn.modules.activation.GELU"}},
        {NEW: {"activation_fn": "torch.nn.modules.linear.Identity"}},
        {OLD: "torch.nn.modules.activation.Tanh"},
        {OLD: "torch.nn.Identity"},
        {NEW: {"activation_fn": "torch.nn.Softsign"}, OLD: "torch.nn.Identity"},  # the new place wins
        {NEW: {"version": "6.3.0"}, OLD: "torch.nn.Tanh"},  # a dict without the key: the old place
        {NEW: {"activation_fn": "torch.nn.modules.activation.Sigmoid"}},
        {},  # nothing saved: sigmoid for one label
    ],
    ids=lambda keys: json.dumps(keys, sort_keys=True),
)
def test_the_saved_activation_scores_as_cross_encoder_predict(base_dir: Path, tmp_path: Path, keys: Any) -> None:
    folder = _saved(base_dir, tmp_path / "saved", **keys)
    ours, theirs = _ours(folder), _predict(folder)
    _close(ours, theirs)
    assert max(theirs) - min(theirs) > 1e-3  # the activation kept the pairs apart


def test_a_cross_encoder_saved_by_sentence_transformers_6_keeps_its_activation(base_dir: Path, tmp_path: Path) -> None:
    """sentence-transformers 6 saves the activation in config_sentence_transformers.json and reads it there
    first, before config.json's places."""
    saved = tmp_path / "saved-by-st"
    CrossEncoder(str(base_dir), device="cpu", activation_fn=torch.nn.Tanh()).save(str(saved))
    written = json.loads((saved / "config_sentence_transformers.json").read_text())
    assert written["activation_fn"] == "torch.nn.modules.activation.Tanh"
    _close(_ours(saved), _predict(saved))
    config = json.loads((saved / "config.json").read_text())
    config[NEW] = {"activation_fn": "torch.nn.modules.linear.Identity"}  # a place read only after it
    (saved / "config.json").write_text(json.dumps(config))
    ours = _ours(saved)
    _close(ours, _predict(saved))
    assert all(-1 < score < 1 for score in ours)  # still Tanh's


def test_a_path_outside_torch_is_sigmoid_without_trust_as_sentence_transformers_says(
    base_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _saved(base_dir, tmp_path / "custom", **{NEW: {"activation_fn": "my_package.activations.Sharp"}})
    with caplog.at_level(logging.WARNING, logger="scorekit.models"):
        ours = _ours(folder)
    _close(ours, _predict(folder))
    _close(ours, _ours(base_dir))  # the default's scores
    assert "'my_package.activations.Sharp', which is not torch's: sigmoid instead" in caplog.text


def test_a_trusted_path_is_imported_and_one_that_cannot_be_is_a_load_error(
    base_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _saved(base_dir, tmp_path / "trusted", **{NEW: {"activation_fn": "torch.nn.modules.activation.Tanh"}})
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        _close(_ours(folder, trust_remote_code=True), _predict(folder, trust_remote_code=True))
    assert "scores with its saved activation torch.nn.modules.activation.Tanh" in caplog.text  # the start-up log
    missing = _saved(base_dir, tmp_path / "missing", **{NEW: {"activation_fn": "torch.nn.NoSuchActivation"}})
    cannot = r"asks for the activation 'torch\.nn\.NoSuchActivation', which cannot be made"
    with pytest.raises(ValueError, match=cannot):
        load_backend(str(missing))
    absent = _saved(base_dir, tmp_path / "absent", **{NEW: {"activation_fn": "no_such_package.Act"}})
    with pytest.raises(ValueError, match=r"asks for the activation 'no_such_package\.Act', which cannot be made"):
        load_spec(ModelSpec(str(absent), trust_remote_code=True))
    wrong = _saved(base_dir, tmp_path / "wrong", **{OLD: 3})
    with pytest.raises(ValueError, match="saved an activation that is not a dotted path: 3"):
        load_backend(str(wrong))


def test_a_served_score_applies_the_saved_activation(base_dir: Path, tmp_path: Path) -> None:
    """Through /score (the served path, its plan and finish), and without it when use_activation is false."""
    folder = _saved(base_dir, tmp_path / "tanh", **{NEW: {"activation_fn": "torch.nn.modules.activation.Tanh"}})
    app = create_app(Settings.for_model(str(folder), name="tanh"))
    body = {"queries": [q for q, _ in PAIRS], "documents": [d for _, d in PAIRS]}
    with serve(app) as live:
        status, payload = live.json("POST", "/score", body)
        assert status == 200, payload
        _close([item["score"] for item in payload["data"]], _predict(folder))
        status, raw = live.json("POST", "/score", {**body, "use_activation": False})
        assert status == 200, raw
        logits = [float(torch.atanh(torch.tensor(score))) for score in _predict(folder)]
        torch.testing.assert_close(
            torch.tensor([item["score"] for item in raw["data"]]), torch.tensor(logits), rtol=0, atol=1e-4
        )


def _windows(logits: list[float], activation: Any) -> tuple[list[float], int]:
    """One pair whose document has a window per logit, scored by ``best_windows``: its score and best window."""
    pairing = Pairing.of(["q"], ["d"])
    inputs = [Encoded(token_array([1, 2, 3])) for _ in logits]
    spans = [[(i, i + 1) for i in range(len(logits))]]
    scores = best_windows(pairing, spans, inputs, logits, activation, chunked=True)
    assert scores.windows is not None
    return scores.scores, scores.windows[0].index


def test_the_best_window_is_the_one_that_scores_best() -> None:
    """A GELU is not monotonic: the window with the higher logit can score lower. Of equal scores (a sigmoid
    saturated), the higher logit wins; of equal logits, the first window."""
    gelu = torch.nn.GELU()

    def activated(logit: float) -> float:
        return float(gelu(torch.tensor([logit]))[0])

    assert _windows([-0.1, -3.0, -0.8], activated)[1] == 1  # GELU(-3) ~ -0.004 beats GELU(-0.1) ~ -0.046
    assert _windows([-0.1, -3.0, -0.8], None)[1] == 0  # the raw logits rank as they are
    assert _windows([40.0, 41.0, 39.0], lambda logit: 1.0)[1] == 1  # a saturated sigmoid: the highest logit
    assert _windows([2.0, 2.0], lambda logit: logit)[1] == 0
