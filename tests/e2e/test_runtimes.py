"""Each runtime beside torch serves what --runtime torch serves, to 1e-5, through a real server: the embedded MiniLM's
embeddings and a tiny cross-encoder's scores and logits, over inputs of several lengths (padded batches) and one
alone (a batch of one). --runtime onnx makes its export once and reuses it from the cache at the next load;
--runtime torchscript refuses a trace that answers differently from its model. Both refuse the LLM kinds."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from scorekit.app import create_app
from scorekit.models import load_backend
from scorekit.settings import ModelSpec, Runtime, Settings
from tests.e2e.texts import DOCS, QUERY
from tests.live import Live, serve

pytestmark = pytest.mark.e2e

TEXTS = [QUERY, *DOCS, "", "a much longer text that runs on, " * 12]
ATOL = 1e-5
HAS_ONNX = importlib.util.find_spec("onnxruntime") is not None
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="the onnx extra is not installed")
RUNTIMES = [pytest.param("onnx", marks=needs_onnx), "torchscript"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def both(cross_encoder_dir: Path, cache: Path) -> Iterator[Live]:
    """MiniLM and the tiny cross-encoder, each served by torch and by every other runtime here, in one server."""
    folder = str(cross_encoder_dir)
    runtimes: list[Runtime] = ["torch", "torchscript"]
    if HAS_ONNX:
        runtimes.append("onnx")
    models = [ModelSpec(name=f"minilm-{runtime}", runtime=runtime, cache_dir=str(cache)) for runtime in runtimes]
    models += [ModelSpec(folder, f"ce-{runtime}", runtime=runtime, cache_dir=str(cache)) for runtime in runtimes]
    with serve(create_app(Settings(models=tuple(models)))) as live:
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


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("texts", [TEXTS, TEXTS[-1:]], ids=["padded", "alone"])
def test_embeddings_match_torch(both: Live, texts: list[str], runtime: str) -> None:
    expected, got = _embeddings(both, "minilm-torch", texts), _embeddings(both, f"minilm-{runtime}", texts)
    for want, have in zip(expected, got, strict=True):
        assert have == pytest.approx(want, abs=ATOL)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("activation", [True, False], ids=["sigmoid", "logit"])
def test_cross_encoder_scores_match_torch(both: Live, activation: bool, runtime: str) -> None:
    for documents in (TEXTS, TEXTS[-1:]):
        expected = _scores(both, "ce-torch", documents, activation)
        assert _scores(both, f"ce-{runtime}", documents, activation) == pytest.approx(expected, abs=ATOL)


@needs_onnx
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


def test_a_trace_that_answers_differently_is_refused(cross_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace follows one path through the model's Python; one that would score other shapes wrong never serves."""
    trace = torch.jit.trace

    def off_by_one(module: torch.nn.Module, sample: Any, **kwargs: Any) -> Any:
        traced = trace(module, sample, **kwargs)
        return lambda *inputs: traced(*inputs) + 1

    monkeypatch.setattr(torch.jit, "trace", off_by_one)
    with pytest.raises(ValueError, match=r"cannot run as a TorchScript trace.*--runtime torch"):
        load_backend(str(cross_encoder_dir), runtime="torchscript")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_llm_kinds_are_refused(causal_lm_dir: Path, runtime: Runtime) -> None:
    with pytest.raises(ValueError, match=f"--runtime {runtime} serves bi-encoders and cross-encoders; a causal-lm"):
        load_backend(str(causal_lm_dir), runtime=runtime)
