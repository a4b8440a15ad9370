"""The model worker: dedicated threads (one by default) that own the model, each running one batch at a time.

torch releases the GIL inside its kernels, so the event loop keeps serving while a batch runs.
A model error fails only the jobs in that batch; anything that escapes a thread's loop kills the worker,
and :attr:`ModelWorker.death` says why (``/health`` turns 503).

With ``threads`` > 1, that many threads take batches from the same queue and run them on the one model at
once. A thread runs its batch on every intra-op thread while it is the only one busy, and on its share while
others are (torch keeps the count per calling thread). On a CPU two batches side by side beat one batch spread
over every core: under OpenMP's passive wait policy, which ``scorekit serve`` sets because spinning threads
starve everything on a shared CPU, the intra-op threads sleep between operations and are woken for each one,
which costs a small forward much of what the second core gains; a lone batch still gains from them
(docs/benchmarks.md, "Model workers"), so it keeps them all. Deliveries and
failures are made under one lock: a request's items can be in two batches that end at once.

What the model cost is told per request: each batch's forward time is split over its items by their tokens
(unpadded) and added to their jobs' ``model_seconds``, failed batches too, so the requests' model seconds add up
to the worker's busy time (``WorkerStats.busy_seconds``). A batch that holds a traced request's items
(``Job.trace``) is also noted on each such job as a :class:`~scorekit.jobs.BatchRun` (its wall-clock times, its
size, the traced jobs in it), for the request's ``batch`` span; with no traced job in it, no clock is read.

The worker never sees the queue it is fed from: the engine hands it callables (take the next batch, close
the queue, fail what waits), so the batcher above it can change without touching it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from scorekit.errors import ModelFailure, WorkerDied
from scorekit.jobs import BatchRun, WorkItem
from scorekit.models.base import Backend, Encoded

logger = logging.getLogger("scorekit.worker")
# (items, padded tokens, seconds the forward took), after each batch that ran.
BatchObserver = Callable[[int, int, float], None]
Batch = list[WorkItem[Encoded, torch.Tensor]]
# Blocks until there is work; None once the queue is closed and drained.
NextBatch = Callable[[], Batch | None]
# Called once, with the failure, when the worker dies: answer every queued job with it and queue no more.
DeathHandler = Callable[[BaseException], None]


@dataclass
class WorkerStats:
    """Counters a test or a benchmark can read; written by the worker's threads one at a time."""

    batches: int = 0
    items: int = 0
    items_of_cancelled_jobs: int = 0
    failed_batches: int = 0
    busy_seconds: float = 0.0  # the forward time of every batch run, failed ones too
    most_busy: int = 0  # the most batches that ran at once (1, or up to the worker's threads)
    recent_batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    recent_batch_jobs: deque[int] = field(default_factory=lambda: deque(maxlen=4096))

    def copy(self) -> WorkerStats:
        """A copy that later batches leave alone."""
        return replace(
            self, recent_batch_sizes=self.recent_batch_sizes.copy(), recent_batch_jobs=self.recent_batch_jobs.copy()
        )


class ModelWorker:
    """Runs ``next_batch()``'s batches on ``backend`` from ``threads`` threads until it returns None; ``close``
    makes it do so. With ``small_batch``, one more thread runs its batches: the engine's small-job lane, fed
    small jobs only, so a small request does not wait for a large one's batch to end."""

    def __init__(
        self,
        backend: Backend,
        *,
        next_batch: NextBatch,
        close: Callable[[], None],
        on_death: DeathHandler,
        on_batch: BatchObserver | None = None,
        threads: int = 1,
        small_batch: NextBatch | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"a model worker needs at least one thread, not {threads}")
        self.backend = backend
        self._close = close
        self._on_death = on_death
        self.stats = WorkerStats()
        self.death: BaseException | None = None
        self._on_batch = on_batch
        self._threads = [
            threading.Thread(target=self._run, args=(next_batch,), name=f"scorekit-model-worker-{n}", daemon=True)
            for n in range(threads)
        ]
        if small_batch is not None:  # the small-job lane: a thread that takes small jobs only
            self._threads.append(
                threading.Thread(target=self._run, args=(small_batch,), name="scorekit-model-lane", daemon=True)
            )
        self._lock = threading.Lock()  # deliveries, failures and the busy count: one thread at a time
        self._busy = 0  # threads running a batch, which share torch's intra-op threads
        self._cpu_threads = 0  # torch's intra-op threads when the worker started

    @property
    def alive(self) -> bool:
        """Every thread runs: one that died took the worker with it (the queue is closed)."""
        return all(thread.is_alive() for thread in self._threads)

    def snapshot(self) -> tuple[WorkerStats, int]:
        """A copy of the counters and how many batches run now, read together under the lock both are written
        under: neither is half of one batch's update."""
        with self._lock:
            return self.stats.copy(), self._busy

    def start(self) -> None:
        self._cpu_threads = torch.get_num_threads()
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._close()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait until every thread has ended (the queue closed and drained, or the worker died), at most
        ``timeout`` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))

    def _run(self, take: NextBatch) -> None:
        batch: Batch = []
        try:
            while (next_batch := take()) is not None:
                batch = next_batch
                with self._busy_share():
                    self._run_batch(batch)
        except BaseException as exc:
            with self._lock:
                if self.death is None:
                    self.death = exc
                logger.critical("the model worker thread died: %r", exc, exc_info=True)
                # Nobody will run anything again: every waiting request gets its answer now.
                failure = WorkerDied(f"The model worker died ({type(exc).__name__}).")
                for item in batch:
                    item.job.fail(failure)
                self._on_death(failure)
            raise

    @contextmanager
    def _busy_share(self) -> Iterator[None]:
        """Count this thread busy while its batch runs, and with several threads, run the batch on its share of
        torch's intra-op threads: all of them when no other thread is busy, so a lone request does not lose
        speed. torch keeps the count per calling thread; a thread that starts alone and is joined keeps its
        count until its batch ends, a brief oversubscription."""
        with self._lock:
            self._busy += 1
            self.stats.most_busy = max(self.stats.most_busy, self._busy)
            share = max(self._cpu_threads // self._busy, 1)
        if len(self._threads) > 1 and torch.get_num_threads() != share:
            torch.set_num_threads(share)
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1

    def _run_batch(self, batch: Batch) -> None:
        tokens = max(item.encoded.cost for item in batch) * len(batch)
        jobs = {id(item.job): item.job for item in batch}
        logger.debug("batch: %d items from %d requests, %d padded tokens", len(batch), len(jobs), tokens)
        traced = any(job.trace is not None for job in jobs.values())
        started_ns = time.time_ns() if traced else 0
        started = time.perf_counter()
        try:
            outputs = self.backend.forward([item.encoded for item in batch])  # under inference_mode (base.inference)
        except Exception as exc:
            seconds = time.perf_counter() - started
            logger.exception("the model failed on a batch of %d items", len(batch))
            with self._lock:
                self.stats.failed_batches += 1
                self._bill(batch, seconds)
                if traced:
                    _note_run(batch, tokens, started_ns, failed=True)
                for job in jobs.values():
                    job.fail(ModelFailure(f"The model failed on this request's batch ({type(exc).__name__})."))
            return
        seconds = time.perf_counter() - started
        if self._on_batch is not None:  # observed before delivery: an answered request's batch is in the metrics
            self._on_batch(len(batch), tokens, seconds)
        with self._lock:
            # Counted before delivery too: once a request has its answer, the items it ran are in the stats.
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.recent_batch_sizes.append(len(batch))
            self.stats.recent_batch_jobs.append(len(jobs))
            self._bill(batch, seconds)
            if traced:
                _note_run(batch, tokens, started_ns, failed=False)
            for item, output in zip(batch, outputs, strict=True):
                if item.job.cancelled:
                    self.stats.items_of_cancelled_jobs += 1
                item.job.deliver(item.index, output)

    def _bill(self, batch: Batch, seconds: float) -> None:
        """The batch's forward time, added to the worker's busy time and split over its items' jobs by the items'
        tokens (under the lock: a job's items can be in two batches that end at once)."""
        self.stats.busy_seconds += seconds
        tokens = sum(item.encoded.cost for item in batch)
        for item in batch:
            item.job.model_seconds += seconds * (item.encoded.cost / tokens if tokens else 1 / len(batch))


def _note_run(batch: Batch, tokens: int, started_ns: int, *, failed: bool) -> None:
    """The batch, noted on each traced job whose items it held (under the worker's lock, before any delivery)."""
    ended_ns = time.time_ns()
    own = Counter(id(item.job) for item in batch if item.job.trace is not None)
    traced = {id(item.job): item.job for item in batch if item.job.trace is not None}
    peers = tuple(job.trace for job in traced.values() if job.trace is not None)
    for key, job in traced.items():
        job.runs.append(BatchRun(started_ns, ended_ns, len(batch), tokens, own[key], peers, failed))
