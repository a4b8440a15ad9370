"""Where a model's batches run: the seam between the engine (the front end's half) and the model's host.

The engine admits, plans, tokenizes and waits; a :class:`ModelHost` queues the engine's jobs, cuts them into
batches and runs them on the model. :class:`LocalHost` does so in this process (a :class:`~scorekit.batching.Batcher`
and a :class:`~scorekit.worker.ModelWorker`), the default; ``scorekit.host.client.HostClient`` does so in a model
host process of its own (``--model-host process``), so the forward never shares an interpreter lock with the
front end's request work.
"""

from __future__ import annotations

import gc
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

import torch

from scorekit.batching import Batcher
from scorekit.model_job import ModelJob
from scorekit.models.base import Backend, Encoded
from scorekit.models.budget import probe_input
from scorekit.settings import EngineConfig, ModelKind
from scorekit.worker import ModelWorker, WorkerStats

logger = logging.getLogger("scorekit.model_host")


def warm_up(backend: Backend, max_batch_tokens: int) -> None:
    """Run one forward of the longest input the model serves (its maximum length, or a batch's whole budget when
    that is shorter), so its first request does not pay for what a first forward sets up (the allocator's pools,
    kernels chosen and loaded, an exported runtime's first run).

    It runs on the backend directly, before the host that owns the model starts taking batches: no request, no
    batch, no metric counts it, and the batcher's cost fit never sees its one-off cost. Whoever starts a model's
    host calls it first (the app for a model served in process, the model host process before it says it is
    ready), so readiness (/readyz) is never reported before it ran."""
    length = min(backend.max_length, max_batch_tokens)
    started = time.perf_counter()
    backend.forward([probe_input(backend, length)])
    logger.info("warmed up %s: one forward of %d tokens in %.2f s", backend.name, length, time.perf_counter() - started)


def freeze_start_up() -> None:
    """Collect once, then move every object start-up left to the garbage collector's permanent generation: the
    models' modules, torch's, transformers' and the tokenizers' own (about 400,000 for the embedded MiniLM).

    A full collection walks every object it tracks while holding the interpreter lock: 150 ms for that process, a
    stall of the event loop (or of a host's batches) that a server under load meets every thousand requests or so,
    as a request's latency. Start-up's objects live as long as the process, so nothing is lost by never walking them
    again, and a full collection then walks only what serving made. ``scorekit serve`` calls it once its models
    are loaded and warmed up (a model host process before it says it is ready); an app that embeds scorekit owns its
    process, and may call ``gc.freeze()`` itself."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    logger.info(
        "%d start-up objects kept out of the garbage collector's full passes (their last one took %.0f ms)",
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1000,
    )


@dataclass(frozen=True, slots=True)
class Health:
    """Whether the engine runs work queued now (``ready``), and if its worker died, why (``death``)."""

    ready: bool
    death: BaseException | None


@dataclass(frozen=True, slots=True)
class Card:
    """What the engine serves, as /v1/models and the start-up log tell it, and as a model host process tells
    it when ready: the model's name (where its weights came from), its kind and the longest input it takes."""

    name: str
    kind: ModelKind
    max_length: int


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """A host's state at one moment: what waits (``queued_items``, their unpadded ``queued_tokens``), the
    batches running, and a copy of the worker's counters that later work leaves alone."""

    queued_items: int
    queued_tokens: int
    running_batches: int
    worker: WorkerStats


class HostObserver(Protocol):
    """What a host reports of its work (the engine's observer is one). ``batch`` is called from the thread
    that learns of the batch (the worker's, or a host client's reader), ``dropped`` from whoever cancels."""

    def batch(self, size: int, tokens: int, seconds: float) -> None:
        """A batch ran: its items, padded tokens and forward time."""

    def dropped(self, items: int) -> None:
        """Queued items of a cancelled request were taken out before they ran."""


class ModelHost(Protocol):
    """A model's queue and worker, wherever they run. ``submit`` raises :class:`~scorekit.batching.QueueFull`
    past the queue's limit; the job is answered through its own ``deliver``/``fail`` and ``notify``."""

    def start(self) -> None:
        """Start running batches (blocking until the host is ready)."""

    def stop(self, timeout: float | None = None) -> None:
        """Stop taking work, finish the batches running, and end the worker (waiting at most ``timeout``)."""

    @property
    def health(self) -> Health:
        """Whether work queued now will run, and why not once the worker has died."""
        ...

    def submit(self, job: ModelJob) -> None:
        """Queue the job's inputs."""

    def cancel(self, job: ModelJob) -> None:
        """Take the job's queued inputs out before they run (its client left); the items dropped are told to
        the observer."""

    def expire(self, job: ModelJob) -> None:
        """Fail the job with a queue timeout unless some of its work has run."""

    def snapshot(self) -> HostSnapshot:
        """The host's counters now."""
        ...

    def queue(self) -> tuple[int, int]:
        """The items and their tokens waiting, known here without asking anyone: what the metrics' gauges read
        on the event loop, where a round trip to a host process must not be waited on."""
        ...

    def requests(self) -> tuple[int, int]:
        """The jobs outstanding, as vLLM's scheduler counts requests: those none of whose items has run yet
        (waiting), and those with a batch run or running (running); known without asking anyone, as ``queue``."""
        ...


class LocalHost:
    """The model's batcher and worker thread(s) in this process: ``--model-host thread``, the default."""

    def __init__(self, backend: Backend, config: EngineConfig, observer: HostObserver) -> None:
        if config.max_batch_tokens is None:  # auto: the app sizes it for the device first (models/budget.py)
            raise ValueError("a LocalHost needs a number of max_batch_tokens: see scorekit.models.budget")
        self.batcher: Batcher[Encoded, torch.Tensor] = Batcher(
            max_batch_tokens=config.max_batch_tokens,
            max_batch_size=config.max_batch_size,
            max_queued_items=config.max_queued_items,
            max_queue_wait=config.max_queue_wait,
            batch_efficiency=config.batch_efficiency if backend.batch_cost_follows_tokens else None,
            min_batch_size=config.min_batch_size,
            priority_aging=config.priority_aging,
        )
        batcher = self.batcher

        def on_batch(size: int, tokens: int, seconds: float) -> None:
            batcher.observe(size, tokens, seconds)  # what the next batches are sized by
            observer.batch(size, tokens, seconds)

        self.worker = ModelWorker(
            backend,
            next_batch=batcher.next_batch,
            close=batcher.close,
            on_death=batcher.fail_all,
            on_batch=on_batch,
            threads=config.model_workers,
            small_batch=(lambda: batcher.next_batch(small=lane)) if (lane := config.small_job_lane) else None,
        )
        self._observer = observer
        # The jobs submitted here: gone once the engine that waits on one lets go of it.
        self._jobs: weakref.WeakSet[ModelJob] = weakref.WeakSet()

    def start(self) -> None:
        self.worker.start()

    def stop(self, timeout: float | None = None) -> None:
        self.worker.stop(timeout)

    @property
    def health(self) -> Health:
        return Health(self.worker.alive, self.worker.death)

    def submit(self, job: ModelJob) -> None:
        self.batcher.submit(job)
        self._jobs.add(job)

    def cancel(self, job: ModelJob) -> None:
        if dropped := self.batcher.cancel(job):
            self._observer.dropped(dropped)

    def expire(self, job: ModelJob) -> None:
        self.batcher.expire(job)

    def snapshot(self) -> HostSnapshot:
        """The worker's counters are read under the lock they are written under, so none is half of one batch's
        update."""
        worker, running = self.worker.snapshot()
        return HostSnapshot(self.batcher.queued, self.batcher.queued_tokens, running, worker)

    def queue(self) -> tuple[int, int]:
        return self.batcher.queued, self.batcher.queued_tokens

    def requests(self) -> tuple[int, int]:
        outstanding = [job for job in list(self._jobs) if not job.done and not job.cancelled]
        waiting = sum(job.started_at is None for job in outstanding)
        return waiting, len(outstanding) - waiting
