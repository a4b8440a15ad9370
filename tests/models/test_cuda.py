"""The GPU paths, on a machine with CUDA (skipped elsewhere, so CI, which has no GPU, skips them): every model
kind scores on the GPU in float32 as on the CPU, in float16 and bfloat16 within the documented error, with
float32 outputs; ``auto`` is float16 there; batches reach the device from pinned memory; ``--max-batch-tokens auto``
sizes the budget from the device's memory, and a batch of it fits; and a server started
with ``device="cuda"`` answers /rerank as the CPU does. Not a benchmark: nothing here is timed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from bench.bf16_accuracy import QUERIES, documents, pair_scores
from scorekit.models import ModelKind, PairScorer, default_model_path, load_backend
from scorekit.models.base import Encoded, no_checkpoint, token_array
from scorekit.models.budget import MEMORY_SHARE, batch_token_budget, token_budgets
from scorekit.models.causal_lm import PER_ROW_LOGITS, TRANSFORMERS
from scorekit.models.padding import pad_batch
from scorekit.settings import EngineConfig, ModelSpec, Settings
from scorekit.tasks import PairOptions
from tests.models.test_bf16 import BUILDS, MINILM_ERROR, TINY_ERROR, Scores, served_rerank
from tests.tiny_models import build_cross_encoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# float32 on the GPU against float32 on the CPU: other kernels (cuBLAS, SDPA), other summation orders.
FLOAT32_ERROR = 1e-4
QUERY_SET = QUERIES[:3]
DOCS = [" ".join(document.split()[:30]) for document in documents(10)]
KINDS: dict[str, tuple[Callable[[Path], Path] | None, ModelKind, Scores]] = {
    "minilm": (None, "bi-encoder", pair_scores),
    **BUILDS,
}


def _folder(name: str, tmp_path: Path) -> str:
    build = KINDS[name][0]
    return default_model_path() if build is None else str(build(tmp_path))


def _error(name: str, dtype: str) -> float:
    if dtype == "float32":
        return FLOAT32_ERROR
    return MINILM_ERROR if name == "minilm" else TINY_ERROR


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_scores_on_the_gpu_as_on_the_cpu(name: str, dtype: str, tmp_path: Path) -> None:
    _, kind, scores = KINDS[name]
    if kind == "causal-lm" and TRANSFORMERS < PER_ROW_LOGITS:
        pytest.skip(f"generative scoring needs transformers {PER_ROW_LOGITS} (this is {TRANSFORMERS})")
    folder = _folder(name, tmp_path)
    exact = scores(load_backend(folder, kind=kind), QUERY_SET, DOCS)
    gpu = load_backend(folder, kind=kind, device="cuda", dtype=dtype)
    assert next(gpu._model.parameters()).device.type == "cuda"  # type: ignore[attr-defined]
    got = scores(gpu, QUERY_SET, DOCS)
    assert got.dtype == torch.float32
    assert float((got - exact).abs().max()) <= _error(name, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", ["minilm", "cross-encoder"])
def test_a_torchscript_trace_scores_on_the_gpu_as_on_the_cpu(name: str, dtype: str, tmp_path: Path) -> None:
    _, kind, scores = KINDS[name]
    folder = _folder(name, tmp_path)
    exact = scores(load_backend(folder, kind=kind), QUERY_SET, DOCS)
    traced = load_backend(folder, kind=kind, device="cuda", dtype=dtype, runtime="torchscript")
    assert float((scores(traced, QUERY_SET, DOCS) - exact).abs().max()) <= _error(name, dtype)


def test_auto_is_float16_on_the_gpu() -> None:
    backend = load_backend(default_model_path(), device="cuda")
    assert next(backend._model.parameters()).dtype == torch.float16  # type: ignore[attr-defined]


def test_a_padded_batch_reaches_the_gpu_whole(tmp_path: Path) -> None:
    backend = load_backend(str(build_cross_encoder(tmp_path)), device="cuda")
    assert isinstance(backend, PairScorer)
    inputs = backend.plan_pairs(["q"], DOCS, PairOptions()).encode(no_checkpoint).inputs
    on_gpu = pad_batch(inputs, 0, torch.device("cuda"))
    on_cpu = pad_batch(inputs, 0, torch.device("cpu"))
    assert on_gpu.keys() == on_cpu.keys()
    for key, value in on_gpu.items():
        assert value.device.type == "cuda"
        assert torch.equal(value.cpu(), on_cpu[key])


@pytest.mark.parametrize("name", sorted(KINDS))
def test_auto_sizes_the_batch_budget_from_the_gpu_memory_and_a_batch_of_it_fits(name: str, tmp_path: Path) -> None:
    _, kind, _ = KINDS[name]
    if kind == "causal-lm" and TRANSFORMERS < PER_ROW_LOGITS:
        pytest.skip(f"generative scoring needs transformers {PER_ROW_LOGITS} (this is {TRANSFORMERS})")
    folder = _folder(name, tmp_path)
    backend = load_backend(folder, kind=kind, device="cuda")
    budget = batch_token_budget(backend, ModelSpec(folder, kind=kind, device="cuda"))
    assert budget.source.startswith("sized for cuda: ") and "KiB per token" in budget.source
    assert backend.max_length <= budget.tokens <= EngineConfig().max_batch_size * backend.max_length
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    longest = Encoded(token_array([0] * backend.max_length), label_token_ids=(0,))
    backend.forward([longest] * (budget.tokens // backend.max_length))
    assert torch.cuda.max_memory_allocated() - before <= MEMORY_SHARE * free


def test_models_on_one_gpu_split_its_memory() -> None:
    folder = default_model_path()
    backend = load_backend(folder, device="cuda")
    uncapped = EngineConfig(max_batch_size=10**7)  # so that only the memory decides
    alone = batch_token_budget(backend, ModelSpec(folder, device="cuda", engine=uncapped)).tokens
    pairs = (("a", "cuda"), ("b", "cuda:0"))  # one GPU, named two ways
    specs = [ModelSpec(folder, name, device=device, engine=uncapped) for name, device in pairs]
    budgets = token_budgets(specs, {"a": backend, "b": backend})
    assert all(abs(budget.tokens - alone / 2) <= 1 for budget in budgets.values())
    assert all("2 models share it" in budget.source for budget in budgets.values())


def test_a_gpu_server_reranks_as_the_cpu_does() -> None:
    exact = pair_scores(load_backend(default_model_path()), QUERY_SET[:1], DOCS)[0]
    got = served_rerank(Settings.for_model(device="cuda"), QUERY_SET[0], DOCS)
    assert float((got - exact).abs().max()) <= MINILM_ERROR  # served in float16, auto's dtype on a GPU
