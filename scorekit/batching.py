"""The dynamic batcher: a thread-safe queue of jobs that the worker cuts into token-budget batches.

Each request is one :class:`Job`. Every batch first takes one item from each queued job, so a
request with thousands of items cannot starve a small one that arrives later, and then fills up
from the jobs with the fewest items left, so a small request finishes in one batch and equal
requests finish in arrival order. Inside a job, items go in
length order, so consecutive batches hold similar lengths and little padding. A cancelled
job's queued items are removed at once and never run.
"""

from __future__ import annotations

import threading
from collections import deque

import torch

from scorekit.jobs import Job, WorkItem
from scorekit.models.base import Encoded

# What the engine queues: tokenized inputs in, one output tensor per input back.
ModelJob = Job[Encoded, torch.Tensor]
ModelItem = WorkItem[Encoded, torch.Tensor]


class QueueFull(Exception):
    """Admitting this job would pass ``max_queued_items``; the caller should answer 503."""


class Batcher:
    """Jobs in, batches out. ``submit``/``cancel`` run on the event loop; ``next_batch`` on the worker."""

    def __init__(self, *, max_batch_tokens: int, max_batch_size: int, max_queued_items: int) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queued_items = max_queued_items
        self._ready = threading.Condition()
        self._jobs: deque[ModelJob] = deque()
        self._queued = 0
        self._closed = False

    @property
    def queued(self) -> int:
        return self._queued

    def submit(self, job: ModelJob) -> None:
        with self._ready:
            if self._closed:
                raise QueueFull("the worker is shutting down")
            if self._queued + len(job.inputs) > self.max_queued_items:
                raise QueueFull(f"{self._queued} items are queued; the limit is {self.max_queued_items}")
            if not job.inputs:
                job._finish()
                return
            self._jobs.append(job)
            self._queued += len(job.inputs)
            self._ready.notify()

    def cancel(self, job: ModelJob) -> int:
        """Drop the job's items that have not run yet; return how many were dropped."""
        with self._ready:
            job.cancelled = True
            dropped = len(job._pending)
            if dropped:
                job._pending.clear()
                self._queued -= dropped
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
            self._queued = 0
            for job in jobs:
                job._pending.clear()
                job.fail(error)
            self._ready.notify_all()

    def next_batch(self) -> list[ModelItem] | None:
        """Block until there is work, then cut one batch; None once closed and drained."""
        with self._ready:
            while not self._jobs:
                if self._closed:
                    return None
                self._ready.wait()
            return self._cut()

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
            batch.append(WorkItem(job, index))
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
