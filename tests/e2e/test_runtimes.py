"""--runtime onnx serves what --runtime torch serves, to 1e-5, through a real server: the embedded MiniLM's
embeddings and a tiny cross-encoder's scores and logits, over inputs of several lengths (padded batches) and one
alone (a batch of one). The export is made once and reused from the cache by the next load."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from scorekit.app import create_app
from scorekit.models import load_backend
from scorekit.settings import ModelSpec, Settings
from tests.e2e.texts import DOCS, QUERY
from tests.live import Live, serve

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.e2e

TEXTS = [QUERY, *DOCS, "", "a much longer text that runs on, " * 12]
ATOL = 1e-5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def both(cross_encoder_dir: Path, cache: Path) -> Iterator[Live]:
    """MiniLM and the tiny cross-encoder, each served by torch and by ONNX Runtime in one server."""
    folder = str(cross_encoder_dir)
    models = (
        ModelSpec(name="minilm-torch"),
        ModelSpec(name="minilm-onnx", runtime="onnx", cache_dir=str(cache)),
        ModelSpec(folder, "ce-torch"),
        ModelSpec(folder, "ce-onnx", runtime="onnx", cache_dir=str(cache)),
    )
    with serve(create_app(Settings(models=models))) as live:
        yield live


def _embeddings(live: Live, model: str, texts: list[str]) -> list[list[float]]:
    status, body = live.json("POST", "/v1/embeddings", {"model": model, "input": texts})
    assert status == 200, body
    return [row["embedding"] for row in body["data"]]


def _scores(live: Live, model: str, documents: list[str], activation: bool) -> list[float]:
    body = {"model": model, "queries": QUERY, "documents": documents, "use_activation": activation}
    status, answer = live.json("POST", "/score", body)
    assert status == 200, answer
    return [row["score"] for row in answer["data"]]


@pytest.mark.parametrize("texts", [TEXTS, TEXTS[-1:]], ids=["padded", "alone"])
def test_embeddings_match_torch(both: Live, texts: list[str]) -> None:
    expected, got = _embeddings(both, "minilm-torch", texts), _embeddings(both, "minilm-onnx", texts)
    for want, have in zip(expected, got, strict=True):
        assert have == pytest.approx(want, abs=ATOL)


@pytest.mark.parametrize("activation", [True, False], ids=["sigmoid", "logit"])
def test_cross_encoder_scores_match_torch(both: Live, activation: bool) -> None:
    for documents in (TEXTS, TEXTS[-1:]):
        expected = _scores(both, "ce-torch", documents, activation)
        assert _scores(both, "ce-onnx", documents, activation) == pytest.approx(expected, abs=ATOL)


def test_a_second_load_reuses_the_export(
    both: Live, cross_encoder_dir: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server above exported each model once; loading one again reads the file and exports nothing."""
    exports = sorted(cache.glob("onnx/*"))
    assert [path.name for path in cache.glob("onnx/*/*")] == ["model.onnx", "model.onnx"]  # and nothing half-written
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        load_backend(str(cross_encoder_dir), runtime="onnx", cache_dir=str(cache))
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("reusing the ONNX export of") for line in said), said
    assert not any(line.startswith("exported") for line in said), said
    assert sorted(cache.glob("onnx/*")) == exports
