"""How many padded tokens one batch may hold when ``--max-batch-tokens`` is ``auto``: sized for the device.

On a CPU the budget is a fixed 16,384 tokens: there per-item cost is nearly flat beyond ~16 items and memory is
rarely what runs out, so what decides a batch's length is what a request waiting behind it can stand
(``--batch-efficiency``). On a GPU a longer batch costs little time, so the budget should be as large as the
device's memory allows, and no larger: a batch past it fails with an out-of-memory error in the middle of
serving. So at start-up the model runs one probe batch of its longest inputs, the allocator's peak over the
loaded model tells what a padded token costs at that length (the worst case per token: attention grows with the
length), and the budget is what fits in a share of the memory left free, divided among the model threads that
run batches at once. A probe that does not fit is halved until it does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch

from scorekit.models.base import Backend, Encoded, token_array
from scorekit.models.files import parse_device
from scorekit.models.loaded import LoadedModel
from scorekit.settings import ModelSpec

CPU_BATCH_TOKENS = 16384
# The share of the GPU memory left free after the model loads that batches may use (the rest: the allocator's
# fragmentation, the outputs a batch copies out, and whatever else the process or another one allocates).
MEMORY_SHARE = 0.8
# Tokens in the probe batch: enough for a batch's activations to outweigh the per-forward buffers.
PROBE_TOKENS = 8192
# Per loaded model: the bytes free on its GPU and the bytes per padded token (see measure_cuda).
_MEASURED: WeakKeyDictionary[Backend, tuple[int, float]] = WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """A batch's padded-token limit and what it came from (for the start-up log)."""

    tokens: int
    source: str


def token_budgets(specs: Sequence[ModelSpec], backends: Mapping[str, Backend]) -> dict[str, TokenBudget]:
    """Each served model's budget, by served name, with every model loaded (``backends``): models on one GPU
    split its free memory. Measured once per loaded model, so the CLI (to refuse in one line before serving)
    and the app (to size its engines) get the same figures. A model in a model host process (``host`` "process")
    gets none here: its host sizes it where its weights are, and tells it when ready."""
    devices = [_device_key(spec.device) for spec in specs]
    for spec, device in zip(specs, devices, strict=True):
        shared = device[0] == "cuda" and devices.count(device) > 1
        if spec.host == "process" and shared and spec.engine.max_batch_tokens is None:
            # Its host measures the memory free beside its own model only: it cannot leave the others their share.
            raise ValueError(
                f"Model {spec.served_name!r} runs in a model host process on {spec.device}, which another served"
                " model shares, so --max-batch-tokens auto cannot size its batches: give --max-batch-tokens a number."
            )
    return {
        spec.served_name: batch_token_budget(backends[spec.served_name], spec, sharing=devices.count(device))
        for spec, device in zip(specs, devices, strict=True)
        if spec.host == "thread"
    }


def batch_token_budget(backend: Backend, spec: ModelSpec, *, sharing: int = 1) -> TokenBudget:
    """The spec's own ``max_batch_tokens``, or (None: auto) the device's: the CPU default, or a GPU's measure,
    of which this model gets a ``sharing``-th (the models served on that GPU)."""
    engine = spec.engine
    if engine.max_batch_tokens is not None:
        return TokenBudget(engine.max_batch_tokens, "--max-batch-tokens")
    device = parse_device(spec.device)
    if device.type != "cuda":
        return TokenBudget(CPU_BATCH_TOKENS, "the CPU default")
    if backend not in _MEASURED:
        _MEASURED[backend] = measure_cuda(backend, device)
    free, per_token = _MEASURED[backend]
    tokens = budget_for(
        free / sharing,
        per_token,
        max_length=backend.max_length,
        max_batch_size=engine.max_batch_size,
        workers=engine.model_workers,
    )
    shared = "" if sharing == 1 else f" (a {sharing}th: {sharing} models share it)"
    source = f"sized for {device}: {free / 2**30:.1f} GiB free{shared}, {per_token / 2**10:.0f} KiB per token"
    return TokenBudget(tokens, source)


def budget_for(free: float, per_token: float, *, max_length: int, max_batch_size: int, workers: int) -> int:
    """The tokens of ``MEMORY_SHARE`` of ``free`` bytes at ``per_token`` bytes each, split among ``workers``
    batches at once; at most ``max_batch_size`` inputs of ``max_length`` (a larger budget never binds). Fewer
    than one input of ``max_length`` is refused: an input the model takes could never run."""
    tokens = int(MEMORY_SHARE * free / workers // per_token)
    if tokens < max_length:
        per_worker = "" if workers == 1 else f" per model thread (of {workers})"
        raise ValueError(
            f"The GPU has room for {tokens} tokens per batch{per_worker}, fewer than one input of {max_length}: "
            "lower --max-model-len or --model-workers, or free memory on the device."
        )
    return min(tokens, max_batch_size * max_length)


def measure_cuda(backend: Backend, device: torch.device) -> tuple[int, float]:
    """The bytes free on ``device`` with the model loaded, and the peak bytes a probe batch allocated per padded
    token; the probe's inputs are as long as the model takes, halved (in number, then in length) until they fit."""
    with torch.cuda.device(device):  # empty_cache frees the current device's cache
        return _measure(backend, device)


def _measure(backend: Backend, device: torch.device) -> tuple[int, float]:
    length = backend.max_length
    count = max(1, PROBE_TOKENS // length)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    while True:
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            backend.forward([probe_input(backend, length)] * count)
            torch.cuda.synchronize(device)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            if count == 1 and length == 1:
                raise ValueError(f"The model leaves no room on {device} for a batch of one token.") from None
            count, length = (count, max(1, length // 2)) if count == 1 else (count // 2, length)
            continue
        peak = torch.cuda.max_memory_allocated(device) - before
        torch.cuda.empty_cache()
        return free, max(peak, 1) / (count * length)


def _device_key(device: str) -> tuple[str, int]:
    """Which device a ``--device`` value names: ``cuda`` is the first GPU, as torch makes it current."""
    parsed = torch.device(device)
    return parsed.type, parsed.index or 0


def probe_input(backend: Backend, length: int) -> Encoded:
    """An input of ``length`` tokens (id 0, in every vocabulary), with a label id for the kinds that read one and
    token type ids for a model that takes them (an exported runtime is fed every input its graph has): what the
    memory probe here and the warm-up (``model_host.warm_up``) run."""
    ids = token_array([0] * length)
    types = ids if isinstance(backend, LoadedModel) and backend.takes_token_types else None
    return Encoded(ids, types, label_token_ids=(0,))
