"""The engine's job: tokenized inputs in, one output tensor per input back, packed into one tensor per job.

The batcher and the worker see a plain :class:`~scorekit.jobs.Job`; only the engine, which knows its inputs
are a backend's :class:`~scorekit.models.base.Encoded` and its outputs torch tensors, makes this one. So the
batcher imports no torch.
"""

from __future__ import annotations

import torch

from scorekit.jobs import Job
from scorekit.models.base import Encoded


class ModelJob(Job[Encoded, torch.Tensor]):
    """What the engine queues: tokenized inputs in, one output tensor per input back, packed into one tensor.

    A backend's outputs are views of its batch's result, which is allocated after that forward's activations.
    Kept until the request ends, thousands of them sit between freed activations, so the allocator can neither
    reuse nor return that memory (docs/benchmarks.md, figure 6b). Copying each output into one tensor per job,
    made at the first delivery, frees every batch's result as soon as the batch is delivered.

    Nor does the job keep a view of its own tensor per output until it is done: a view is a small allocation
    made on the worker thread among the activations, so thousands of them fragment the heap as well. A packed
    output's place in ``results`` holds the packed tensor itself, and :meth:`outputs` makes the rows once the
    job is done."""

    _packed: torch.Tensor | None = None

    def deliver(self, index: int, output: torch.Tensor) -> None:
        if not self.done:
            output = self._pack(index, output)
        super().deliver(index, output)

    def _pack(self, index: int, output: torch.Tensor) -> torch.Tensor:
        """The job's tensor, holding ``output`` as row ``index``; or ``output`` itself when it cannot."""
        packed = self._packed
        if packed is None:
            shape = (len(self.inputs), *output.shape)
            packed = self._packed = torch.empty(shape, dtype=output.dtype, device=output.device)
        if packed.shape[1:] != output.shape or packed.dtype != output.dtype or packed.device != output.device:
            return output  # outputs of another shape (none of today's backends makes them): kept as they came
        packed[index] = output
        return packed

    def outputs(self) -> list[torch.Tensor]:
        """The delivered outputs in input order (undelivered ones left out)."""
        packed = self._packed
        rows = [] if packed is None else packed.unbind()
        return [
            rows[index] if output is packed else output
            for index, output in enumerate(self.results)
            if output is not None
        ]
