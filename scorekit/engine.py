"""The scoring engine: one model's task methods, admission, tokenizing off the loop, and awaiting a job on
the model worker.

Endpoints call a task method (:meth:`Engine.score_pairs`, :meth:`Engine.label_scores`) with plain data from
``scorekit.tasks`` and get plain data back, or one of ``scorekit.errors``' typed errors. The backend that has
the capability turns the request into a :class:`~scorekit.models.base.Plan`; the engine checks it can ever
fit, admits it, tokenizes it (in a thread when large), queues it, awaits it and lets the plan finish it.
If the request is cancelled (its client left), tokenizing stops at its next checkpoint and the ``finally``
here removes its queued items before they run. With ``max_queue_wait``, or the request's own deadline
(``X-Request-Timeout``), a request none of whose work has run by then is taken out of the queue at that deadline
and answered :class:`~scorekit.errors.QueueTimeout` (one whose deadline passed while it tokenized, at once).

The request's :class:`~scorekit.ticket.Ticket` says where its job goes in the queue (its key's fair share, its
priority, its deadline) and holds its key's item quota, taken at admission before any tokenizing; what its job
cost on the model (model seconds) is added back to the ticket and told to the observer by key.

What happens to each request (its tokenizing time, queue wait, rejection, cancellation or failure) is told
to an :class:`EngineObserver`, the app's metrics, where it happens; and, when the request is traced
(``tracing.py``), to its trace: a ``tokenize`` span, its job's ``queue`` and ``batch`` spans, and an event when its
queued work is dropped (its client left, or its deadline passed).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import torch

from scorekit import tracing
from scorekit.batching import QueueFull
from scorekit.errors import (
    InputTooLong,
    InvalidRequest,
    ModelFailure,
    NotReady,
    Overloaded,
    QueueTimeout,
    ScorekitError,
    Unsupported,
    WorkerDied,
)
from scorekit.jobs import Schedule
from scorekit.load import Cell, LocalCell
from scorekit.model_host import Card, Health, HostObserver, LocalHost, ModelHost
from scorekit.model_job import ModelJob
from scorekit.models.base import (
    Backend,
    Checkpoint,
    Embedder,
    Encoded,
    LabelScorer,
    PairScorer,
    Plan,
    SparseEmbedder,
    TokenEmbedder,
    no_checkpoint,
)
from scorekit.settings import EngineConfig
from scorekit.tasks import (
    Embeddings,
    EmbedOptions,
    LabelQuery,
    LabelScores,
    PairOptions,
    PairScores,
    SparseEmbeddings,
    SparseOptions,
    TokenEmbeddings,
    TokenEmbedOptions,
)
from scorekit.ticket import Ticket, current_ticket
from scorekit.worker import WorkerStats

T = TypeVar("T")
R = TypeVar("R")

# Tokenizing a few kilobytes takes well under a millisecond: cheaper inline than a thread hop.
INLINE_TOKENIZE_CHARS = 4096


class Abandoned(Exception):
    """Raised inside a tokenizing thread at a checkpoint once its request has gone; nobody catches it."""


@dataclass
class EngineStats:
    """Tokenizing counters, read through :meth:`Engine.snapshot`. Written from tokenizing threads: each ``+=`` is one
    bytecode-level update under the GIL, and readers only need a count that stops growing.

    ``tokenize_work`` counts the units of tokenizing work done (characters tokenized, tokens copied into
    model inputs, ``tokens.Meter``), ``tokenize_chunks`` the checkpoints between them, ``largest_step`` the
    most work done between two checkpoints, and ``work_after_abandon`` what a thread did between its request
    being abandoned and its stop, summed over requests (each at most one step)."""

    tokenize_chunks: int = 0
    tokenizing_stopped: int = 0
    tokenize_work: int = 0
    largest_step: int = 0
    work_after_abandon: int = 0


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine's state at one moment, for tests, benchmarks and the metrics' gauges: what waits
    (``queued_items``, their unpadded ``queued_tokens``), the requests this engine admitted (this front-end
    process's, not the server's: ``idle`` says this engine's counters cannot move), the batches running, and
    copies of the worker's and the tokenizing counters that later work leaves alone."""

    queued_items: int
    queued_tokens: int
    active_requests: int
    running_batches: int
    worker: WorkerStats
    tokenizing: EngineStats

    @property
    def idle(self) -> bool:
        """No request admitted, nothing queued and no batch running: no counter can move until a new request."""
        return self.active_requests == 0 and self.queued_items == 0 and self.running_batches == 0


class EngineObserver(HostObserver, Protocol):
    """What one engine reports as it works (``scorekit.metrics.ModelMetrics`` counts it): its host's batches
    and drops, and the rest from the loop (``tokenized`` also from a tokenizing thread). Reasons and stages
    are short fixed words."""

    def tokenized(self, seconds: float) -> None:
        """A request tokenized for this time (until it stopped, when its client left): from the event loop
        or, for a large request, its tokenizing thread."""

    def waited(self, seconds: float) -> None:
        """A request's first item ran this long after it was queued."""

    def rejected(self, reason: str) -> None:
        """A request was refused before any of its work ran: not_ready, too_many_inputs, overloaded,
        rate_limited, too_long, invalid or queue_timeout."""

    def model_seconds(self, key: str, seconds: float) -> None:
        """A request of fair-share ``key`` ("" without API keys) used the model this long (its share of its
        batches' forward time), told when it ends."""

    def cancelled(self, stage: str) -> None:
        """A request's client left while it was tokenizing, queued or running."""

    def failed(self, reason: str) -> None:
        """A request's batch failed: model_error, or worker_died."""


class Engine:
    """One model's front end: its task methods, admission, tokenizing and the wait, over the host that runs
    its batches (its batcher and worker, in this process unless ``host`` says otherwise).

    The requests it admits are counted in ``admitted``: with ``--api-processes``, a cell of the load board that
    every front end's engine for this model counts in, so ``max_concurrent_requests`` limits the whole server and
    :attr:`active_requests` is the model's count over every front end (what /load answers)."""

    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        *,
        observer: EngineObserver,
        host: ModelHost | None = None,
        admitted: Cell | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        # What the backend can do, resolved once: a task it lacks is refused before any work.
        self._pairs = backend if isinstance(backend, PairScorer) else None
        self._labels = backend if isinstance(backend, LabelScorer) else None
        self._embedder = backend if isinstance(backend, Embedder) else None
        self._sparse = backend if isinstance(backend, SparseEmbedder) else None
        self._token_embedder = backend if isinstance(backend, TokenEmbedder) else None
        # Where its batches run: this process by default (LocalHost), or a model host process the app started.
        self.host: ModelHost = LocalHost(backend, config, observer) if host is None else host
        self._observer = observer
        self._admitted: Cell = LocalCell() if admitted is None else admitted
        self._stats = EngineStats()

    @property
    def active_requests(self) -> int:
        """The requests admitted to this model and not yet answered, over every front-end process."""
        return self._admitted.value

    def start(self) -> None:
        self.host.start()

    def stop(self, timeout: float | None = None) -> None:
        self.host.stop(timeout)

    @property
    def ready(self) -> bool:
        """The worker is running: work queued now will be run."""
        return self.host.health.ready

    @property
    def health(self) -> Health:
        """Whether work queued now will run, and why not once the worker has died: /health and Ray's probes."""
        return self.host.health

    @property
    def card(self) -> Card:
        """The served model as /v1/models and the start-up log describe it."""
        backend = self.backend
        return Card(backend.name, backend.kind, backend.max_length)

    def snapshot(self) -> EngineSnapshot:
        """The engine's counters now: the host's, the requests admitted here and a copy of the tokenizing ones."""
        host = self.host.snapshot()
        admitted = self._admitted.here
        return EngineSnapshot(
            host.queued_items, host.queued_tokens, admitted, host.running_batches, host.worker, replace(self._stats)
        )

    def queue(self) -> tuple[int, int]:
        """The items and their tokens waiting, without a round trip to a model host process: for the metrics'
        gauges, read on the event loop."""
        return self.host.queue()

    def requests(self) -> tuple[int, int]:
        """The requests queued that wait for their first batch, and those with a batch run or running, without a
        round trip: vLLM's waiting and running, for the metrics' gauges."""
        return self.host.requests()

    async def score_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> PairScores:
        """One score per (side1, side2) pair, 1:N or N:N: /score and /rerank."""
        if self._pairs is None:
            raise self._unsupported("scoring text pairs")
        return await self.execute(self._pairs.plan_pairs(side1, side2, options))

    async def label_scores(self, query: LabelQuery) -> LabelScores:
        """Label-token probabilities of the next token after each prompt: /generative_scoring."""
        if self._labels is None:
            raise self._unsupported("label-token scoring")
        return await self.execute(self._labels.plan_labels(query))

    async def embed(self, texts: list[str], options: EmbedOptions) -> Embeddings:
        """One vector per text: /v1/embeddings and /embed."""
        if self._embedder is None:
            raise self._unsupported("embedding texts")
        return await self.execute(self._embedder.plan_embed(texts, options))

    async def embed_sparse(self, texts: list[str], options: SparseOptions) -> SparseEmbeddings:
        """One sparse vector per text (its non-zero weights by token id): TEI's /embed_sparse."""
        if self._sparse is None:
            raise self._unsupported("sparse embedding")
        return await self.execute(self._sparse.plan_embed_sparse(texts, options))

    async def token_embed(self, texts: list[str], options: TokenEmbedOptions) -> TokenEmbeddings:
        """One vector per token of each text, as the request's role encodes it: /pooling's token_embed and
        /embed_all."""
        if self._token_embedder is None:
            raise self._unsupported("per-token embedding")
        return await self.execute(self._token_embedder.plan_token_embed(texts, options))

    async def execute(self, plan: Plan[R]) -> R:
        """Run one request's plan: every limit its shape decides is checked before any tokenizing, so an
        impossible request costs nothing but its decoding."""
        if not self.ready:
            raise self._rejected("not_ready", NotReady("The model is not ready."))
        limit = self.config.max_queued_items
        if plan.count > limit:  # can never be admitted: a 400 now, not a 503 that says retry
            raise self._rejected(
                "too_many_inputs",
                _too_many(plan.count, limit),
            )
        ticket = current_ticket()
        with self.admit():
            self._take_quota(ticket, plan.count)
            try:
                with tracing.span(
                    "tokenize",
                    {"scorekit.inputs": plan.count, "scorekit.characters": plan.chars},
                    client_errors=(InvalidRequest,),  # too long, or a truncation past the model's (400s)
                ):
                    encoding = await self.prepare(plan.encode, chars=plan.chars)
            except InputTooLong as exc:  # its places say where it is in the request; the route names them
                raise self._rejected("too_long", exc) from None
            except InvalidRequest as exc:
                raise self._rejected("invalid", exc) from None
            except anyio.get_cancelled_exc_class():
                self._observer.cancelled("tokenizing")
                raise
            if len(encoding.inputs) > limit:  # a chunked document's windows are known only now
                raise self._rejected("too_many_inputs", _too_many(len(encoding.inputs), limit))
            outputs = await self.run(encoding.inputs, ticket)
        return encoding.finish(outputs)

    def _take_quota(self, ticket: Ticket, items: int) -> None:
        """The request's model inputs, taken from its key's item quota; the answer that refuses them is raised."""
        if ticket.quota is None:
            return
        try:
            ticket.quota(items)
        except Exception:
            self._observer.rejected("rate_limited")
            raise

    def _rejected(self, reason: str, error: ScorekitError) -> ScorekitError:
        """``error``, counted as a request rejected for ``reason`` before any of its work ran."""
        self._observer.rejected(reason)
        return error

    def _unsupported(self, task: str) -> Unsupported:
        return Unsupported(f"The {self.backend.kind} model {self.backend.name!r} cannot do {task}.")

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Count one request against ``max_concurrent_requests`` for as long as it runs.

        The limit is the whole server's: the count read is over every front-end process. The check and the count
        are not one atomic step across processes, so front ends admitting at the same instant may pass it, by one
        each; that is the only imprecision (within one process both run on the event loop, nothing between)."""
        admitted = self._admitted
        if (active := admitted.value) >= self.config.max_concurrent_requests:
            raise self._rejected("overloaded", Overloaded(f"requests in flight: {active}, the limit"))
        admitted.add(1)
        try:
            yield
        finally:
            admitted.add(-1)

    async def prepare(self, tokenize: Callable[[Checkpoint], T], *, chars: int) -> T:
        """Tokenize inline when small, else in a thread, so a large request never blocks the loop.

        If the request is cancelled (its client left) while the thread tokenizes, the request returns at
        once, and the thread stops at its next checkpoint, within one bounded unit of work
        (``tokens.CHUNK_CHARS``). Its time is recorded either way, by whoever ran it, when it stops: a
        request abandoned mid-tokenizing still shows what it cost.
        """
        observer, stats = self._observer, self._stats
        if chars <= INLINE_TOKENIZE_CHARS:
            with _timed(observer.tokenized):
                return tokenize(no_checkpoint)
        abandoned = threading.Event()

        def checkpoint(units: int) -> None:
            stats.tokenize_work += units
            stats.largest_step = max(stats.largest_step, units)
            if abandoned.is_set():
                stats.work_after_abandon += units
                stats.tokenizing_stopped += 1
                raise Abandoned
            stats.tokenize_chunks += 1

        def run(checkpoint: Checkpoint) -> T:
            with _timed(observer.tokenized):
                return tokenize(checkpoint)

        try:
            return await anyio.to_thread.run_sync(run, checkpoint, abandon_on_cancel=True)
        finally:
            abandoned.set()

    async def run(self, inputs: list[Encoded], ticket: Ticket | None = None) -> list[torch.Tensor]:
        """Queue the inputs as one job, placed as the request's ticket says, and wait for every output (or the
        batch's error)."""
        ticket = current_ticket() if ticket is None else ticket
        schedule, deadline = self._schedule(ticket)
        done = anyio.Event()
        trace = tracing.current()
        ref = None if trace is None else trace.ref  # None: not traced, or not sampled
        job = ModelJob(inputs, notify=_wake_loop(done.set), schedule=schedule, trace=ref)
        submitted_ns = tracing.now_ns() if ref is not None else 0
        try:
            self.host.submit(job)
        except QueueFull as exc:
            raise self._rejected("overloaded", Overloaded(str(exc))) from None
        try:
            await self._wait(job, done)
        finally:
            if not job.done:  # cancelled: its client left
                self.host.cancel(job)
                self._observer.cancelled("queued" if job.started_at is None else "running")
            if job.started_at is not None:
                self._observer.waited(job.started_at - job.queued_at)
            ticket.add_model_seconds(job.model_seconds)  # what ran so far, its client gone or not
            self._observer.model_seconds(ticket.key, job.model_seconds)
            if trace is not None and ref is not None:
                _trace_job(trace, job, ticket, submitted_ns)
        if job.error is not None:
            self._count_error(job.error)
            if isinstance(job.error, QueueTimeout) and deadline is not None:
                raise QueueTimeout(deadline)  # in the seconds the client gave
            raise job.error
        return job.outputs()

    def _schedule(self, ticket: Ticket) -> tuple[Schedule, float | None]:
        """Where the request's job goes: its ticket's priority and key, and the seconds it may wait queued, the
        time left to its deadline or ``max_queue_wait``, whichever is shorter (nothing left: the batcher expires
        it before it cuts another batch); with the request's timeout when its deadline is the shorter (the seconds
        its queue timeout is told in), else None."""
        limit, deadline = self.config.max_queue_wait, None
        if ticket.deadline is not None:
            left = ticket.deadline - time.monotonic()
            if limit is None or left < limit:
                limit, deadline = left, left if ticket.timeout is None else ticket.timeout
        return Schedule(ticket.priority, ticket.key, ticket.weight, limit), deadline

    async def _wait(self, job: ModelJob, done: anyio.Event) -> None:
        """Until the job is done; at its queue-wait limit after it was queued (``max_queue_wait``, or what was
        left of the request's deadline), the batcher expires it unless some of its work has run (a request with a
        batch running is never cut)."""
        limit = job.schedule.timeout
        if limit is not None:
            with anyio.move_on_after(limit):
                await done.wait()
            self.host.expire(job)
        await done.wait()

    def _count_error(self, error: BaseException) -> None:
        if isinstance(error, QueueTimeout):
            self._observer.rejected("queue_timeout")
        elif isinstance(error, WorkerDied):
            self._observer.failed("worker_died")
        elif isinstance(error, ModelFailure):
            self._observer.failed("model_error")


def _trace_job(trace: tracing.RequestTrace, job: ModelJob, ticket: Ticket, submitted_ns: int) -> None:
    """The job's ``queue`` and ``batch`` spans on the request's trace, its model seconds, and the event of its
    dropped work: queued items its client left behind (the batcher drops them), or a job its deadline expired."""
    trace.job(
        submitted_ns,
        tracing.now_ns(),
        job.runs,
        {"scorekit.items": len(job.inputs), "scorekit.priority": job.schedule.priority},
    )
    noted: dict[str, float | str] = {"scorekit.model_seconds": ticket.model_seconds or 0.0}
    if ticket.key:
        noted["scorekit.key"] = ticket.key  # the key's name, never the key
    trace.note(noted)
    if not job.done:
        unfinished = sum(result is None for result in job.results)
        trace.event("scorekit.work_dropped", {"scorekit.reason": "client_left", "scorekit.items": unfinished})
    elif isinstance(job.error, QueueTimeout):
        trace.event("scorekit.work_dropped", {"scorekit.reason": "deadline", "scorekit.items": len(job.inputs)})


@contextmanager
def _timed(record: Callable[[float], None]) -> Iterator[None]:
    """Record the seconds the block took, however it ends (an abandoned request's tokenizing included)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        record(time.perf_counter() - started)


def _too_many(count: int, limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"This request needs {count} model inputs, but the server queues at most {limit}; "
        "send it as several smaller requests."
    )


def _wake_loop(callback: Callable[[], None]) -> Callable[[], None]:
    """A callable for the worker thread that schedules ``callback`` on this event loop, never blocking."""
    native = anyio.lowlevel.current_token().native_token
    is_asyncio = isinstance(native, asyncio.AbstractEventLoop)
    # An asyncio loop, or else a trio token: both schedule a callback from another thread.
    schedule: Callable[[Callable[[], None]], object] = (
        native.call_soon_threadsafe if is_asyncio else native.run_sync_soon  # type: ignore[attr-defined]
    )

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            schedule(callback)

    return wake
