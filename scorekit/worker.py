"""The model worker: one dedicated thread that owns the model and runs one batch at a time.

torch releases the GIL inside its kernels, so the event loop keeps serving while a batch runs.
A model error fails only the jobs in that batch; anything that escapes the loop kills the thread,
and :attr:`ModelWorker.death` says why (``/health`` turns 503).

The worker never sees the queue it is fed from: the engine hands it callables (take the next batch, close
the queue, fail what waits), so the batcher above it can change without touching it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scorekit.errors import ModelFailure, WorkerDied
from scorekit.jobs import WorkItem
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
    """Counters a test or a benchmark can read; written only by the worker thread."""

    batches: int = 0
    items: int = 0
    items_of_cancelled_jobs: int = 0
    failed_batches: int = 0
    recent_batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    recent_batch_jobs: deque[int] = field(default_factory=lambda: deque(maxlen=4096))


class ModelWorker:
    """Runs ``next_batch()``'s batches on ``backend`` until it returns None; ``close`` makes it do so."""

    def __init__(
        self,
        backend: Backend,
        *,
        next_batch: NextBatch,
        close: Callable[[], None],
        on_death: DeathHandler,
        on_batch: BatchObserver | None = None,
    ) -> None:
        self.backend = backend
        self._next_batch = next_batch
        self._close = close
        self._on_death = on_death
        self.stats = WorkerStats()
        self.death: BaseException | None = None
        self._on_batch = on_batch
        self._thread = threading.Thread(target=self._run, name="scorekit-model-worker", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        batch: Batch = []
        try:
            while (next_batch := self._next_batch()) is not None:
                batch = next_batch
                self._run_batch(batch)
        except BaseException as exc:
            self.death = exc
            logger.critical("the model worker thread died: %r", exc, exc_info=True)
            # Nobody will run anything again: every waiting request gets its answer now.
            failure = WorkerDied(f"The model worker died ({type(exc).__name__}).")
            for item in batch:
                item.job.fail(failure)
            self._on_death(failure)
            raise

    def _run_batch(self, batch: Batch) -> None:
        tokens = max(item.encoded.cost for item in batch) * len(batch)
        jobs = {id(item.job): item.job for item in batch}
        logger.debug("batch: %d items from %d requests, %d padded tokens", len(batch), len(jobs), tokens)
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                outputs = self.backend.forward([item.encoded for item in batch])
        except Exception as exc:
            logger.exception("the model failed on a batch of %d items", len(batch))
            self.stats.failed_batches += 1
            for job in jobs.values():
                job.fail(ModelFailure(f"The model failed on this request's batch ({type(exc).__name__})."))
            return
        seconds = time.perf_counter() - started
        # Counted before delivery: once a request has its answer, the items it ran are in the stats.
        self.stats.batches += 1
        self.stats.items += len(batch)
        self.stats.recent_batch_sizes.append(len(batch))
        self.stats.recent_batch_jobs.append(len(jobs))
        if self._on_batch is not None:  # observed before delivery too: an answered request's batch is in the metrics
            self._on_batch(len(batch), tokens, seconds)
        for item, output in zip(batch, outputs, strict=True):
            if item.job.cancelled:
                self.stats.items_of_cancelled_jobs += 1
            item.job.deliver(item.index, output)
