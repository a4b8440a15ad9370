"""The dynamic batcher: a thread-safe queue of jobs that the worker cuts into token-budget batches.

Each request is one :class:`Job`. Every batch first takes one item from each queued job, so a
request with thousands of items cannot starve a small one that arrives later, and then fills up
from the jobs with the fewest items left, so a small request finishes in one batch and equal
requests finish in arrival order. Inside a job, items go in
length order, so consecutive batches hold similar lengths and little padding. A cancelled
job's queued items are removed at once and never run.

A batch is never interrupted, so a job that arrives while one runs waits for it, unless the engine runs a
small-job lane: a thread whose ``next_batch(small=N)`` cuts batches from jobs of at most N items only, and so
is free when a small job arrives beside a large one. Otherwise what bounds that wait is how long a batch runs.
Each forward has a fixed cost and then a nearly flat cost per token (on a CPU, per-item cost is nearly flat
beyond ~16 items), so past some size a longer batch buys little throughput and costs every newcomer its whole
length in waiting. With ``batch_efficiency``, the fill stops at the shortest batch that keeps that share of an
endless batch's throughput, by the :class:`BatchCost` fitted to the batches the worker ran, and the batch that
carries a new job's first items stops about one such batch time after that job arrived. A small job then waits
for at most the batch in flight and one short batch. The budget is a share, not seconds, so it suits a small
encoder and a slow LLM alike: the batch length follows from the costs measured on the model. The fill still
completes the job with the fewest items left when all of it fits in one batch of the budget, so a small job is
never split by it.

With ``max_queue_wait``, a job none of whose items has run that long after it was queued is taken out and
failed with :class:`~scorekit.errors.QueueTimeout`: the engine asks for that at the deadline (``expire``),
and ``next_batch`` checks it too, so an overdue job never runs even when the event loop is late.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic

from scorekit.errors import QueueTimeout
from scorekit.jobs import InputT, Job, OutputT, WorkItem


class BatchCost:
    """What a batch of padded tokens costs in seconds: ``fixed + per_token * tokens``, fitted by least squares
    over the batches the worker ran (``observe``), the latest weighing most (``memory`` per batch).

    A fit needs batches of different sizes, which traffic makes: a request's last batch, a small request, a
    large one's first (cut by tokens alone while there is no fit). Until then, batches are cut by tokens and
    size alone, as without a budget. While later sizes stay too alike to tell the fixed cost from the
    per-token one, or a fit makes no sense (no fixed cost, or a cost that falls with size: a held or stalled
    batch), the last good fit stands. Where the cost barely grows with size (a GPU), the fit's shortest
    efficient batch is longer than ``max_batch_tokens``, which then decides."""

    def __init__(self, memory: float = 0.95) -> None:
        self.memory = memory
        # Weighted sums over the batches: of 1, tokens, seconds, tokens squared, tokens times seconds.
        self._sums = [0.0] * 5
        self.fit: tuple[float, float] | None = None  # (fixed seconds, seconds per padded token)

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        new = (1.0, float(tokens), seconds, float(tokens) ** 2, tokens * seconds)
        self._sums = [self.memory * old + add for old, add in zip(self._sums, new, strict=True)]
        weight, x, y, xx, xy = self._sums
        mean_x, mean_y = x / weight, y / weight
        spread = xx / weight - mean_x**2
        if spread < (0.1 * mean_x) ** 2:  # sizes within ~10% of each other: the slope would be noise
            return
        per_token = (xy / weight - mean_x * mean_y) / spread
        fixed = mean_y - per_token * mean_x
        if per_token > 0 and fixed > 0:
            self.fit = (fixed, per_token)


class QueueFull(Exception):
    """Admitting this job would pass ``max_queued_items``; the caller should answer 503."""


class Batcher(Generic[InputT, OutputT]):
    """Jobs in, batches out. ``submit``/``cancel`` run on the event loop; ``next_batch`` on the worker. Any
    :class:`~scorekit.jobs.Job` will do: an input is priced by its ``cost`` alone."""

    def __init__(
        self,
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queued_items: int,
        max_queue_wait: float | None = None,
        batch_efficiency: float | None = None,
        min_batch_size: int = 1,
        cost: BatchCost | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queued_items = max_queued_items
        self.max_queue_wait = max_queue_wait
        self.batch_efficiency = batch_efficiency
        self.min_batch_size = min_batch_size
        self.cost = cost or BatchCost()
        self._clock = clock
        self._ready = threading.Condition()
        self._jobs: deque[Job[InputT, OutputT]] = deque()
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

    def observe(self, items: int, tokens: int, seconds: float) -> None:
        """A batch ran (called by the worker, a :data:`~scorekit.worker.BatchObserver`, from any of its threads):
        learn its cost."""
        with self._ready:
            self.cost.observe(tokens, seconds)

    def submit(self, job: Job[InputT, OutputT]) -> None:
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
            # Every waiting thread: each takes what it can (the worker's threads anything, a small-job lane's thread
            # small jobs), so none is woken for work it cannot take while a thread that could sleeps on.
            self._ready.notify_all()

    def cancel(self, job: Job[InputT, OutputT]) -> int:
        """Drop the job's items that have not run yet; return how many were dropped."""
        with self._ready:
            job.cancelled = True
            return self._remove(job)

    def expire(self, job: Job[InputT, OutputT]) -> bool:
        """At its queue-wait deadline: take the job out and fail it with QueueTimeout, unless some of its work
        has run (or it is over); whether it was taken out."""
        with self._ready:
            return self._expire(job)

    def _expire(self, job: Job[InputT, OutputT]) -> bool:
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

    def _remove(self, job: Job[InputT, OutputT]) -> int:
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

    def next_batch(self, small: int | None = None) -> list[WorkItem[InputT, OutputT]] | None:
        """Block until there is work, then cut one batch; None once closed and drained. Overdue jobs are
        expired first, so none of their work runs. With ``small``, only jobs of at most that many inputs count
        as work (the small-job lane's thread)."""
        with self._ready:
            while True:
                self._expire_overdue()
                jobs = self._jobs if small is None else deque(job for job in self._jobs if len(job.inputs) <= small)
                if jobs:
                    return self._cut(jobs)
                if self._closed:
                    return None
                self._ready.wait()

    def _budgets(self, jobs: deque[Job[InputT, OutputT]]) -> tuple[int, int]:
        """The padded tokens this batch may hold (the ceiling), and what it may hold beyond completing the
        smallest job (the budget). Both are ``max_batch_tokens`` without ``batch_efficiency`` or a cost fit.

        With them, the ceiling is the shortest batch that keeps ``batch_efficiency`` of an endless batch's
        tokens per second: ``per_token * n / (fixed + per_token * n) = e`` gives ``n = e / (1 - e) * fixed /
        per_token``, a batch of ``fixed / (1 - e)`` seconds. The budget is what runs in what is left of that
        long since the oldest job none of whose items has run was queued: the batch that carries a new job
        ends about one batch time after the job arrived, filled with other work up to then."""
        efficiency, fit = self.batch_efficiency, self.cost.fit
        if efficiency is None or fit is None:
            return self.max_batch_tokens, self.max_batch_tokens
        fixed, per_token = fit
        ceiling = int(efficiency / (1 - efficiency) * fixed / per_token)
        # Never below min_batch_size items, padded to the longest queued one (so padding cannot make it fewer):
        # a fit made on a busy machine can put the efficient length at an item or two, which the throughput
        # measured there does not bear out.
        longest = max((job.inputs[job._pending[-1]].cost for job in jobs if job._pending), default=0)
        floor = self.min_batch_size * longest
        ceiling = min(max(ceiling, floor), self.max_batch_tokens)
        waiting = [job.queued_at for job in jobs if job.started_at is None]
        if not waiting:
            return ceiling, ceiling
        left = min(waiting) + fixed / (1 - efficiency) - self._clock()
        return ceiling, min(max(int((left - fixed) / per_token), 0), ceiling)

    def _cut(self, jobs: deque[Job[InputT, OutputT]]) -> list[WorkItem[InputT, OutputT]]:
        """One item from every one of ``jobs`` first (nobody starves), then fill from the shortest jobs: the
        shortest one up to the ceiling when all of it fits there (a small job is not split), the rest within
        the budget left."""
        batch: list[WorkItem[InputT, OutputT]] = []
        longest = 0
        ceiling, budget = self._budgets(jobs)

        def take(job: Job[InputT, OutputT], limit: int) -> bool:
            nonlocal longest
            index = job._pending[0]
            cost = max(longest, job.inputs[index].cost)
            if len(batch) >= self.max_batch_size or (batch and cost * (len(batch) + 1) > limit):
                return False
            job._pending.popleft()
            if job.started_at is None:
                job.started_at = self._clock()
            batch.append(WorkItem(job, index))
            self._queued_tokens -= job.inputs[index].cost
            longest = cost
            return True

        full = False
        for job in jobs:
            if not take(job, self.max_batch_tokens):
                full = True
                break
        by_size = sorted(jobs, key=lambda j: len(j._pending))  # stable: equal jobs stay in arrival order
        for rank, job in enumerate(by_size):
            limit = ceiling if rank == 0 and self._completes(job, batch, longest, ceiling) else budget
            while not full and job._pending:
                full = not take(job, limit)
        self._queued -= len(batch)
        self._jobs = deque(job for job in self._jobs if job._pending)
        return batch

    def _completes(
        self, job: Job[InputT, OutputT], batch: list[WorkItem[InputT, OutputT]], longest: int, limit: int
    ) -> bool:
        """Whether all the job's pending items fit in this batch within ``limit`` padded tokens beside what it
        holds (its pending items are in length order, so the last is the longest)."""
        count = len(batch) + len(job._pending)
        cost = max(longest, job.inputs[job._pending[-1]].cost) if job._pending else longest
        return count <= self.max_batch_size and cost * count <= limit
