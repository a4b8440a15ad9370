"""``--dtype bfloat16`` on the CPU: every model kind serves scores within the bf16 error docs/models.md states,
as float32 tensors; and the start-up line says what bf16 costs or may gain on this CPU. Not a benchmark:
nothing here is timed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from bench.bf16_accuracy import QUERIES, documents, label_scores, pair_scores
from scorekit.app import create_app
from scorekit.models import Backend, ModelKind, default_model_path, load_backend
from scorekit.models import bf16 as bf16_module
from scorekit.models.base import Encoded
from scorekit.models.bf16 import bf16_line, log_cpu_bf16
from scorekit.settings import Settings
from tests.live import serve
from tests.tiny_models import build_causal_lm, build_cross_encoder, build_gemma_reranker, build_qwen3_reranker

# docs/models.md, "bfloat16 on the CPU": the largest score difference from float32 each kind may show. The
# trained MiniLM's is a real bound; the tiny random models' is only a sanity check of the arithmetic.
MINILM_ERROR = 0.01
TINY_ERROR = 0.5

QUERY_SET = QUERIES[:3]
# Short documents keep the emulated bf16 forward of the real MiniLM to a second or two.
DOCS = [" ".join(document.split()[:30]) for document in documents(10)]

Scores = Callable[[Backend, Sequence[str], Sequence[str]], torch.Tensor]
BUILDS: dict[str, tuple[Callable[[Path], Path], ModelKind, Scores]] = {
    "cross-encoder": (build_cross_encoder, "cross-encoder", pair_scores),
    "causal-lm": (build_causal_lm, "causal-lm", label_scores),
    "qwen3-reranker": (build_qwen3_reranker, "llm-reranker", pair_scores),
    "gemma-reranker": (build_gemma_reranker, "llm-reranker", pair_scores),
}


@pytest.fixture(autouse=True)
def _log_afresh() -> Iterator[None]:
    """The bf16 line is logged once per process and dtype; each test starts as a fresh process would."""
    log_cpu_bf16.cache_clear()
    yield
    log_cpu_bf16.cache_clear()


def _check(exact: Backend, approximate: Backend, scores: Scores, error: float) -> None:
    """bf16 weights really ran, every raw output is float32, and the scores are within ``error`` of float32's."""
    assert next(approximate._model.parameters()).dtype == torch.bfloat16  # type: ignore[attr-defined]
    assert next(exact._model.parameters()).dtype == torch.float32  # type: ignore[attr-defined]
    dtypes = _record_output_dtypes(approximate)
    expected, got = scores(exact, QUERY_SET, DOCS), scores(approximate, QUERY_SET, DOCS)
    assert dtypes == {torch.float32}
    difference = float((got - expected).abs().max())
    assert 0 < difference <= error, difference  # 0 would mean both ran in float32


def _record_output_dtypes(backend: Backend) -> set[torch.dtype]:
    """The dtypes of every output ``backend.forward`` hands back from now on (filled as it runs)."""
    seen: set[torch.dtype] = set()
    forward = backend.forward

    def recording(batch: Sequence[Encoded]) -> list[torch.Tensor]:
        outputs = forward(batch)
        seen.update(output.dtype for output in outputs)
        return outputs

    backend.forward = recording  # type: ignore[method-assign]
    return seen


@pytest.fixture(scope="module")
def minilm() -> Backend:
    return load_backend(default_model_path(), dtype="float32")


def test_minilm_in_bf16_is_within_its_documented_error(minilm: Backend) -> None:
    _check(minilm, load_backend(default_model_path(), dtype="bfloat16"), pair_scores, MINILM_ERROR)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_each_tiny_kind_in_bf16_is_within_the_sanity_bound(name: str, tmp_path: Path) -> None:
    build, kind, scores = BUILDS[name]
    folder = str(build(tmp_path))
    _check(load_backend(folder, kind=kind), load_backend(folder, kind=kind, dtype="bfloat16"), scores, TINY_ERROR)


def test_a_bf16_server_reranks_within_the_documented_error(minilm: Backend) -> None:
    """End to end: MiniLM served in bfloat16 by uvicorn (``Settings.for_model(dtype=...)``, as ``--dtype``), /rerank's
    scores against float32's."""
    exact = pair_scores(minilm, QUERY_SET[:1], DOCS)[0]
    got = served_rerank(Settings.for_model(dtype="bfloat16"), QUERY_SET[0], DOCS)
    assert 0 < float((got - exact).abs().max()) <= MINILM_ERROR


def served_rerank(settings: Settings, query: str, documents: list[str]) -> torch.Tensor:
    """/rerank's scores from a server started with ``settings``, in the documents' order."""
    with serve(create_app(settings)) as live:
        status, body = live.json("POST", "/rerank", {"query": query, "documents": documents})
    assert status == 200, body
    got = torch.zeros(len(documents))
    for result in body["results"]:
        got[result["index"]] = result["relevance_score"]
    return got


# The start-up line


@pytest.mark.parametrize(
    ("dtype", "native", "level", "says"),
    [
        (
            torch.float32,
            [],
            logging.DEBUG,
            "no native bf16 (no avx512_bf16 or amx_bf16): --dtype bfloat16 would be emulated, about 5x slower",
        ),
        (
            torch.bfloat16,
            [],
            logging.WARNING,
            "bfloat16 is emulated, about 5x slower than float32 (docs/benchmarks.md); --dtype float32 is faster",
        ),
        (
            torch.float32,
            ["avx512_bf16", "amx_bf16"],
            logging.INFO,
            "native bf16 (avx512_bf16, amx_bf16): --dtype bfloat16 may run faster (about 3x less CPU per forward with"
            " amx_bf16 (docs/benchmarks.md), 3.5-5x with --runtime openvino (docs/models.md)",
        ),
        (
            torch.float32,
            ["avx512_bf16"],
            logging.INFO,
            "native bf16 (avx512_bf16): --dtype bfloat16 may run faster (no speed figure measured without amx_bf16",
        ),
        (
            torch.bfloat16,
            ["avx512_bf16", "amx_bf16"],
            logging.INFO,
            "native bf16 (avx512_bf16, amx_bf16): serving bfloat16",
        ),
    ],
)
def test_the_bf16_line_says_what_bf16_costs_here(dtype: torch.dtype, native: list[str], level: int, says: str) -> None:
    assert bf16_line(dtype, native)[0] == level
    assert says in bf16_line(dtype, native)[1]


def test_loading_on_a_cpu_without_native_bf16_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(bf16_module, "native_bf16", lambda: [])
    folder = str(build_cross_encoder(tmp_path))
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        load_backend(folder, dtype="bfloat16")
        load_backend(folder, dtype="bfloat16")  # a second model with the same --dtype
    lines = [(record.levelno, record.getMessage()) for record in caplog.records if "bf16" in record.getMessage()]
    assert lines == [(logging.WARNING, bf16_line(torch.bfloat16, [])[1])]


def test_auto_is_float32_on_a_cpu_with_one_info_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(bf16_module, "native_bf16", lambda: ["amx_bf16"])
    with caplog.at_level(logging.INFO, logger="scorekit.models"):
        backend = load_backend(str(build_cross_encoder(tmp_path)))
    assert next(backend._model.parameters()).dtype == torch.float32  # type: ignore[attr-defined]
    lines = [(record.levelno, record.getMessage()) for record in caplog.records if "bf16" in record.getMessage()]
    assert lines == [(logging.INFO, bf16_line(torch.float32, ["amx_bf16"])[1])]
