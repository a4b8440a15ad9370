"""Each runtime beside torch serves what --runtime torch serves, to 1e-5, through a real server: the embedded MiniLM's
embeddings and a tiny cross-encoder's scores and logits, over inputs of several lengths (padded batches) and one
alone (a batch of one). --runtime onnx makes its export once and reuses it from the cache at the next load, and
exports a damaged cached file again; --runtime openvino in bfloat16 scores within the bf16 error docs/models.md
states, and refuses bfloat16 on a CPU without native bf16; --runtime torchscript refuses a trace that answers
differently from its model. All refuse the LLM kinds."""

from __future__ import annotations

import gc
import importlib.util
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.bf16_accuracy import pair_scores
from scorekit.app import create_app
from scorekit.choices import Runtime
from scorekit.models import default_model_path, load_backend
from scorekit.models import loaded as loaded_module
from scorekit.models.bf16 import native_bf16
from scorekit.settings import ModelSpec, Settings
from tests.e2e.texts import DOCS, QUERY
from tests.live import Live, serve
from tests.models.test_bf16 import DOCS as BF16_DOCS
from tests.models.test_bf16 import MINILM_ERROR, QUERY_SET, TINY_ERROR

pytestmark = pytest.mark.e2e

TEXTS = [QUERY, *DOCS, "", "a much longer text that runs on, " * 12]
ATOL = 1e-5
HAS_ONNX = importlib.util.find_spec("onnxruntime") is not None
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="the onnx extra is not installed")
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
needs_openvino = pytest.mark.skipif(not HAS_OPENVINO, reason="the openvino extra is not installed")
RUNTIMES = [pytest.param("onnx", marks=needs_onnx), pytest.param("openvino", marks=needs_openvino), "torchscript"]


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
    if HAS_OPENVINO:
        runtimes.append("openvino")
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
    # One export per model and runtime that reads one, and nothing half-written.
    assert [path.name for path in cache.glob("onnx/*/*")] == ["model.onnx"] * 2 * (1 + HAS_OPENVINO)
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        load_backend(str(cross_encoder_dir), runtime="onnx", cache_dir=str(cache))
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("reusing the ONNX export of") for line in said), said
    assert not any(line.startswith("exported") for line in said), said
    assert sorted(cache.glob("onnx/*")) == exports


@pytest.mark.parametrize("runtime", RUNTIMES[:2])  # the two that read a cached export
def test_a_damaged_cached_export_is_exported_again(
    runtime: Runtime, cross_encoder_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cached file the runtime cannot read (damaged on disk) is replaced, with a warning, and the model serves
    as torch does; the load after that reuses the new file."""
    folder = str(cross_encoder_dir)
    load_backend(folder, runtime=runtime, cache_dir=str(tmp_path))
    [cached] = tmp_path.glob("onnx/*/model.onnx")
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 3])
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        backend = load_backend(folder, runtime=runtime, cache_dir=str(tmp_path))
    said = [record.getMessage() for record in caplog.records]
    warned = [line for line in said if "cannot be loaded" in line]
    assert len(warned) == 1 and str(cached.parent) in warned[0] and warned[0].endswith("; exporting it again"), said
    assert any(line.startswith("exported") for line in said), said
    exact = pair_scores(load_backend(folder), QUERY_SET, BF16_DOCS)
    assert float((pair_scores(backend, QUERY_SET, BF16_DOCS) - exact).abs().max()) <= ATOL
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        load_backend(folder, runtime=runtime, cache_dir=str(tmp_path))
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("reusing") for line in said) and not any("cannot be loaded" in line for line in said)


@needs_openvino
def test_openvino_splits_a_lone_batch_over_its_streams_and_keeps_the_order(
    cross_encoder_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two streams (two model threads), a batch that runs alone is cut in two parts that run at once, and the
    scores come back in input order, as torch's; a batch of one input runs whole."""
    import openvino

    started: list[int] = []
    start_async = openvino.InferRequest.start_async

    def counted(self: Any, inputs: dict[str, Any], *args: Any) -> Any:
        started.append(len(next(iter(inputs.values()))))
        return start_async(self, inputs, *args)

    monkeypatch.setattr(openvino.InferRequest, "start_async", counted)
    folder = str(cross_encoder_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a stream per thread: the suite runs on one (tests/conftest.py)
    try:
        backend = load_backend(folder, runtime="openvino", callers=2, cache_dir=str(tmp_path))
    finally:
        torch.set_num_threads(threads)
    documents = [f"document {n}, " * (1 + 3 * n) for n in range(7)]  # distinct, of several lengths (padded)
    exact = pair_scores(load_backend(folder), [QUERY], documents)
    assert float((pair_scores(backend, [QUERY], documents) - exact).abs().max()) <= ATOL
    assert started == [4, 3]
    started.clear()
    assert float((pair_scores(backend, [QUERY], documents[:1]) - exact[:, :1]).abs().max()) <= ATOL
    assert started == []


@needs_openvino
@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bf16")
@pytest.mark.parametrize("model", ["minilm", "cross-encoder"])
def test_openvino_in_bf16_is_within_the_documented_error(model: str, cross_encoder_dir: Path, tmp_path: Path) -> None:
    """OpenVINO really computes in bfloat16 (the scores move off float32's), within the error bf16 may show, and
    hands float32 scores back. (Its exports go to a cache of its own: the server's cache counts its exports.)"""
    folder, error = (default_model_path(), MINILM_ERROR) if model == "minilm" else (str(cross_encoder_dir), TINY_ERROR)
    exact = pair_scores(load_backend(folder), QUERY_SET, BF16_DOCS)
    got = pair_scores(
        load_backend(folder, runtime="openvino", dtype="bfloat16", cache_dir=str(tmp_path)), QUERY_SET, BF16_DOCS
    )
    assert got.dtype == torch.float32
    assert 0 < float((got - exact).abs().max()) <= error


@needs_openvino
def test_openvino_refuses_bf16_without_native_bf16(
    cross_encoder_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU without native bf16 OpenVINO would quietly compute in float32; the load says so instead."""
    import openvino

    class NoBF16(openvino.Core):  # type: ignore[misc]
        def get_property(self, *args: Any) -> Any:
            if args[1:] == ("OPTIMIZATION_CAPABILITIES",):
                return ["FP32", "INT8"]
            return super().get_property(*args)

    monkeypatch.setattr(openvino, "Core", NoBF16)
    with pytest.raises(ValueError, match=r"^--runtime openvino runs bfloat16 only on a CPU with native bf16"):
        load_backend(str(cross_encoder_dir), runtime="openvino", dtype="bfloat16", cache_dir=str(tmp_path))


@pytest.mark.parametrize(
    ("runtime", "kept"),
    [
        ("torch", True),
        pytest.param("onnx", False, marks=needs_onnx),
        pytest.param("openvino", False, marks=needs_openvino),
    ],
)
def test_a_runtime_with_its_own_weights_lets_the_torch_module_go(
    runtime: Runtime, kept: bool, cross_encoder_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime and OpenVINO hold their own copy of every weight: once the forward is made, nothing keeps the
    torch module alive beside it (a base-size model's second copy is hundreds of MB). torch's forward runs it."""
    loaded: list[weakref.ref[torch.nn.Module]] = []
    load_model = loaded_module.load_model

    def recording(*args: Any) -> Any:
        model = load_model(*args)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(loaded_module, "load_model", recording)
    backend = load_backend(str(cross_encoder_dir), runtime=runtime, cache_dir=str(tmp_path))
    gc.collect()
    assert len(loaded) == 1 and (loaded[0]() is not None) == kept
    assert pair_scores(backend, QUERY_SET, BF16_DOCS).isfinite().all()


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
