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

Which job goes first is its :class:`~scorekit.jobs.Schedule`. Jobs are ranked in levels: a job's priority (lower
runs earlier) less one for every ``priority_aging`` seconds it has waited, but never past the best priority
queued, so a job of any priority reaches the front level in bounded time and none starves. Both passes serve
the most urgent level first. Within a level, the items go to the keys by weighted fair queuing: each key has a
virtual time, which every item taken advances by its tokens over the key's weight, and the key whose virtual
time is least goes next (a key that had nothing queued starts at the virtual time of the items being served,
so an idle key banks no credit). With one key (a server that asks no API key) and one priority, this is exactly
the order described above.

With ``max_queue_wait``, or a job's own ``timeout`` (the request's deadline), a job none of whose items has run
that long after it was queued is taken out and failed with :class:`~scorekit.errors.QueueTimeout`: the engine
asks for that at the deadline (``expire``), and ``next_batch`` checks it too, so an overdue job never runs even
when the event loop is late.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic

from scorekit.errors import QueueTimeout
from scorekit.jobs import InputT, Job, OutputT, Schedule, WorkItem


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
        priority_aging: float = 1.0,
        cost: BatchCost | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queued_items = max_queued_items
        self.max_queue_wait = max_queue_wait
        self.batch_efficiency = batch_efficiency
        self.min_batch_size = min_batch_size
        self.priority_aging = priority_aging
        self.cost = cost or BatchCost()
        self._clock = clock
        self._ready = threading.Condition()
        self._jobs: deque[Job[InputT, OutputT]] = deque()
        self._queued = 0
        self._queued_tokens = 0
        self._closed = False
        # Weighted fair queuing: each key's virtual finish (the tokens it has had over its weight), and the
        # virtual time of the items being served, below which no key's time is counted (:meth:`_time_of`).
        self._finish: dict[str, float] = {}
        self._virtual = 0.0

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

    def _limit(self, job: Job[InputT, OutputT]) -> float | None:
        """The seconds the job may wait queued before any of its work runs: its own timeout or
        ``max_queue_wait``, whichever is shorter; None when it has neither."""
        return min((limit for limit in (job.schedule.timeout, self.max_queue_wait) if limit is not None), default=None)

    def _expire(self, job: Job[InputT, OutputT]) -> bool:
        limit = self._limit(job)
        if job.done or job.started_at is not None or limit is None:
            return False
        self._remove(job)
        job.fail(QueueTimeout(limit))
        return True

    def _expire_overdue(self) -> None:
        now = self._clock()
        for job in [job for job in self._jobs if now - job.queued_at > _or_endless(self._limit(job))]:
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

    def _cut(self, queued: deque[Job[InputT, OutputT]]) -> list[WorkItem[InputT, OutputT]]:
        """One item from every queued job first (nobody starves), then fill from the shortest jobs: the
        shortest one up to the ceiling when all of it fits there (a small job is not split), the rest within
        the budget left. Both passes go level by level, and within a level by the keys' fair shares (the
        module's docstring); with one level and one key, the first pass is in arrival order."""
        batch: list[WorkItem[InputT, OutputT]] = []
        longest = 0
        ceiling, budget = self._budgets(queued)
        levels = self._levels(queued)
        jobs = self._in_turn(queued, levels)

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
            self._charge(job.schedule, job.inputs[index].cost)
            longest = cost
            return True

        full = False
        for job in jobs:
            if not take(job, self.max_batch_tokens):
                full = True
                break
        by_size = sorted(jobs, key=lambda j: len(j._pending))  # stable: equal jobs stay in arrival order
        for rank, job in () if full else self._fill_turns(by_size, levels):
            limit = ceiling if rank == 0 and self._completes(job, batch, longest, ceiling) else budget
            if not take(job, limit):
                break
        self._queued -= len(batch)
        self._jobs = deque(job for job in self._jobs if job._pending)
        return batch

    def _levels(self, jobs: deque[Job[InputT, OutputT]]) -> dict[int, int]:
        """Each job's level by its id, lower first: its priority less one for each ``priority_aging`` seconds
        it has waited since it was queued, but never past the best priority queued. Aging lifts a job to the
        front level in bounded time, and no further: within a level, waiting longer buys nothing, so the fair
        shares and the shortest-first fill decide there, as without priorities."""
        now, aging = self._clock(), self.priority_aging
        best = min(job.schedule.priority for job in jobs)
        return {id(job): max(job.schedule.priority - math.floor((now - job.queued_at) / aging), best) for job in jobs}

    def _in_turn(self, jobs: deque[Job[InputT, OutputT]], levels: dict[int, int]) -> list[Job[InputT, OutputT]]:
        """The order the first pass takes one item of each job in: the most urgent level first; within a level
        the keys in turn by their virtual time, as each job's first item would advance it, and each key's jobs
        in arrival order."""
        order: list[Job[InputT, OutputT]] = []
        for level in _grouped(jobs, levels):
            keys = _by_key(level)
            finish = {key: self._time_of(key) for key in keys}
            while keys:
                key = min(keys, key=finish.__getitem__)  # ties: the key whose oldest job came first
                job = keys[key].popleft()
                finish[key] += job.inputs[job._pending[0]].cost / job.schedule.weight
                order.append(job)
                if not keys[key]:
                    del keys[key]
        return order

    def _fill_turns(
        self, by_size: list[Job[InputT, OutputT]], levels: dict[int, int]
    ) -> Iterator[tuple[int, Job[InputT, OutputT]]]:
        """The fill's turns, one per item to take (the caller takes it, or stops): the most urgent level first;
        within a level the key whose virtual time is least, read afresh each turn, and its job with the fewest
        items left. Each comes with its job's rank in ``by_size`` (0: the job the ceiling may be stretched for)."""
        ranks = {id(job): rank for rank, job in enumerate(by_size)}
        for level in _grouped(by_size, levels):
            keys = _by_key(job for job in level if job._pending)
            while keys:
                key = min(keys, key=self._time_of)
                job = keys[key][0]
                yield ranks[id(job)], job
                if not job._pending:
                    keys[key].popleft()
                    if not keys[key]:
                        del keys[key]

    def _time_of(self, key: str) -> float:
        """The key's virtual time: where its last item taken finished, but never behind the items being served,
        so a key that had nothing queued (or waited behind a more urgent level) banks no credit for it."""
        return max(self._finish.get(key, 0.0), self._virtual)

    def _charge(self, schedule: Schedule, tokens: int) -> None:
        """An item of ``tokens`` was taken for the key: the items served are now at its virtual time, and the key
        moves on by the item's tokens over its weight."""
        start = self._virtual = self._time_of(schedule.key)
        self._finish[schedule.key] = start + tokens / schedule.weight

    def _completes(
        self, job: Job[InputT, OutputT], batch: list[WorkItem[InputT, OutputT]], longest: int, limit: int
    ) -> bool:
        """Whether all the job's pending items fit in this batch within ``limit`` padded tokens beside what it
        holds (its pending items are in length order, so the last is the longest)."""
        count = len(batch) + len(job._pending)
        cost = max(longest, job.inputs[job._pending[-1]].cost) if job._pending else longest
        return count <= self.max_batch_size and cost * count <= limit


def _or_endless(limit: float | None) -> float:
    return math.inf if limit is None else limit


def _grouped(jobs: Iterable[Job[InputT, OutputT]], levels: dict[int, int]) -> list[list[Job[InputT, OutputT]]]:
    """The jobs by level (``levels``: each one's by its id), the most urgent first, each level in the given order."""
    grouped: dict[int, list[Job[InputT, OutputT]]] = {}
    for job in jobs:
        grouped.setdefault(levels[id(job)], []).append(job)
    return [grouped[level] for level in sorted(grouped)]


def _by_key(jobs: Iterable[Job[InputT, OutputT]]) -> dict[str, deque[Job[InputT, OutputT]]]:
    """The jobs grouped by their fair-share key, each group in the given order, the keys in order of first sight."""
    keys: dict[str, deque[Job[InputT, OutputT]]] = {}
    for job in jobs:
        keys.setdefault(job.schedule.key, deque()).append(job)
    return keys
