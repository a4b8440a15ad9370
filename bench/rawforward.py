"""The ceiling: the backend's own ``forward`` called in this process on pre-tokenized inputs.

This is what the model can do with no HTTP, no JSON, no queue and no event loop, on the same texts
the load generator sends, chunked in request order at each batch size.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.cpu import Reading
from scorekit.models import default_model_path, load_backend
from scorekit.models.base import Backend, Encoded


@dataclass
class Ceiling:
    """A loaded backend and the texts of one request set, tokenized once."""

    backend: Backend
    inputs: list[Encoded]
    tokenize_items_per_s: float

    @classmethod
    def load(cls, texts: Sequence[Sequence[str]]) -> Ceiling:
        backend = load_backend(default_model_path())
        encode = backend.encode_texts  # type: ignore[attr-defined]
        started = time.perf_counter()
        inputs = [item for request in texts for item in encode(list(request), None, None)]
        rate = len(inputs) / (time.perf_counter() - started)
        return cls(backend, inputs, rate)

    @property
    def threads(self) -> int:
        """torch's intra-op threads in this process: what each forward here runs on."""
        return torch.get_num_threads()

    @property
    def mean_tokens(self) -> float:
        return sum(item.cost for item in self.inputs) / len(self.inputs)

    def rate(self, batch_size: int, seconds: float) -> Rate:
        """Forward consecutive chunks for at least ``seconds`` (and two batches)."""
        inputs = self.inputs
        with torch.inference_mode():
            self.backend.forward(inputs[:batch_size])  # warm the shapes' kernels
            items = batches = 0
            offset = 0
            start = Reading.take(None)
            while batches < 2 or time.perf_counter() - start.wall < seconds:
                if offset + batch_size > len(inputs):
                    offset = 0
                self.backend.forward(inputs[offset : offset + batch_size])
                offset += batch_size
                items += batch_size
                batches += 1
            cpu = Reading.take(None).minus(start)
        return Rate(items / cpu["wall_s"], items / cpu["own_cpu_s"], cpu["other_cores"])

    def sweep(self, batch_sizes: Sequence[int], seconds: float) -> dict[int, Rate]:
        return {size: self.rate(size, seconds) for size in batch_sizes}


@dataclass(frozen=True, slots=True)
class Rate:
    """Items per wall second and per CPU second of this process; the cores other jobs kept busy."""

    items_per_s: float
    items_per_cpu_s: float
    other_cores: float

    def as_dict(self) -> dict[str, float]:
        return {
            "items_per_s": self.items_per_s,
            "items_per_cpu_s": self.items_per_cpu_s,
            "other_cores": self.other_cores,
        }
