"""The dynamic batcher: a thread-safe queue of jobs that the worker cuts into token-budget batches.

Each request is one :class:`Job`. Every batch first takes one item from each queued job, so a
request with thousands of items cannot starve a small one that arrives later, and then fills up
from the jobs with the fewest items left, so a small request finishes in one batch and equal
requests finish in arrival order. Inside a job, items go in
length order, so consecutive batches hold similar lengths and little padding. A cancelled
job's queued items are removed at once and never run.

With ``max_queue_wait``, a job none of whose items has run that long after it was queued is taken out and
failed with :class:`~scorekit.errors.QueueTimeout`: the engine asks for that at the deadline (``expire``),
and ``next_batch`` checks it too, so an overdue job never runs even when the event loop is late.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from scorekit.errors import QueueTimeout
from scorekit.jobs import Job, WorkItem
from scorekit.models.base import Encoded

ModelItem = WorkItem[Encoded, torch.Tensor]


class ModelJob(Job[Encoded, torch.Tensor]):
    """What the engine queues: tokenized inputs in, one output tensor per input back, packed into one tensor.

    A backend's outputs are views of its batch's result, which is allocated after that forward's activations.
    Kept until the request ends, thousands of them sit between freed activations, so the allocator can neither
    reuse nor return that memory: a 10,000-document rerank held about 300 MB more at its peak than a
    1,000-document one (docs/benchmarks.md, figure 6b). Copying each output into one tensor per job, made at
    the first delivery, frees every batch's result as soon as the batch is delivered.

    Nor does the job keep a view of its own tensor per output until it is done: a view is a small allocation
    made on the worker thread among the activations, so 10,000 of them kept fragmented the heap as well (the
    10,000-document rerank's peak, 9 KiB per document). A packed output's place in ``results`` holds the
    packed tensor itself, and :meth:`outputs` makes the rows once the job is done."""

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


class QueueFull(Exception):
    """Admitting this job would pass ``max_queued_items``; the caller should answer 503."""


class Batcher:
    """Jobs in, batches out. ``submit``/``cancel`` run on the event loop; ``next_batch`` on the worker."""

    def __init__(
        self,
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queued_items: int,
        max_queue_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queued_items = max_queued_items
        self.max_queue_wait = max_queue_wait
        self._clock = clock
        self._ready = threading.Condition()
        self._jobs: deque[ModelJob] = deque()
        self._queued = 0
        self._queued_tokens = 0
        self._closed = False

    @property
    def queued(self) -> int:
        """Items waiting to run."""
        return self._queued

    @property
    def queued_tokens(self) -> int:
        """The unpadded tokens of the items waiting to run: the work ahead, which items alone do not say."""
        return self._queued_tokens

    def submit(self, job: ModelJob) -> None:
        with self._ready:
            if self._closed:
                raise QueueFull("the worker is shutting down")
            if self._queued + len(job.inputs) > self.max_queued_items:
                raise QueueFull(f"{self._queued} items are queued; the limit is {self.max_queued_items}")
            if not job.inputs:
                job._finish()
                return
            job.queued_at = self._clock()
            self._jobs.append(job)
            self._queued += len(job.inputs)
            self._queued_tokens += sum(item.cost for item in job.inputs)
            self._ready.notify()

    def cancel(self, job: ModelJob) -> int:
        """Drop the job's items that have not run yet; return how many were dropped."""
        with self._ready:
            job.cancelled = True
            return self._remove(job)

    def expire(self, job: ModelJob) -> bool:
        """At its queue-wait deadline: take the job out and fail it with QueueTimeout, unless some of its work
        has run (or it is over); whether it was taken out."""
        with self._ready:
            return self._expire(job)

    def _expire(self, job: ModelJob) -> bool:
        if job.done or job.started_at is not None or self.max_queue_wait is None:
            return False
        self._remove(job)
        job.fail(QueueTimeout(self.max_queue_wait))
        return True

    def _expire_overdue(self) -> None:
        if self.max_queue_wait is None:
            return
        now = self._clock()
        for job in [job for job in self._jobs if now - job.queued_at > self.max_queue_wait]:
            self._expire(job)

    def _remove(self, job: ModelJob) -> int:
        """Take the job's pending items out of the queue; how many there were."""
        dropped = len(job._pending)
        if dropped:
            self._queued -= dropped
            self._queued_tokens -= sum(job.inputs[index].cost for index in job._pending)
            job._pending.clear()
            self._jobs.remove(job)
        return dropped

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def fail_all(self, error: BaseException) -> None:
        """Close, and fail every queued job: nobody is left to run them (the worker died)."""
        with self._ready:
            self._closed = True
            jobs, self._jobs = self._jobs, deque()
            self._queued = self._queued_tokens = 0
            for job in jobs:
                job._pending.clear()
                job.fail(error)
            self._ready.notify_all()

    def next_batch(self) -> list[ModelItem] | None:
        """Block until there is work, then cut one batch; None once closed and drained. Overdue jobs are
        expired first, so none of their work runs."""
        with self._ready:
            while True:
                self._expire_overdue()
                if self._jobs:
                    return self._cut()
                if self._closed:
                    return None
                self._ready.wait()

    def _cut(self) -> list[ModelItem]:
        """One item from every queued job first (nobody starves), then fill from the shortest jobs."""
        batch: list[ModelItem] = []
        longest = 0

        def take(job: ModelJob) -> bool:
            nonlocal longest
            index = job._pending[0]
            cost = max(longest, job.inputs[index].cost)
            if len(batch) >= self.max_batch_size or (batch and cost * (len(batch) + 1) > self.max_batch_tokens):
                return False
            job._pending.popleft()
            if job.started_at is None:
                job.started_at = self._clock()
            batch.append(WorkItem(job, index))
            self._queued_tokens -= job.inputs[index].cost
            longest = cost
            return True

        full = False
        for job in self._jobs:
            if not take(job):
                full = True
                break
        for job in sorted(self._jobs, key=lambda j: len(j._pending)):  # stable: equal jobs stay in arrival order
            while not full and job._pending:
                full = not take(job)
        self._queued -= len(batch)
        self._jobs = deque(job for job in self._jobs if job._pending)
        return batch
