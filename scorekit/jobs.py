"""One request's work on its way through the queue to the model: a :class:`Job` and its :class:`WorkItem` s.

A leaf module, so the batcher that queues jobs and the worker that runs them share these types without the
worker knowing the batcher. It needs no torch: a job is generic in what its inputs and outputs are, and only
asks each input for its ``cost`` (what it adds to a batch's token budget). Where a job goes in the queue is its
:class:`Schedule`: its priority, the API key whose fair share it draws on, and how long it may wait. A job of a
traced request (``tracing.py``) carries its span's :data:`TraceRef`, and the worker notes each batch it rode in as
a :class:`BatchRun`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Costed(Protocol):
    """An input the batcher can price: its padded length in tokens."""

    @property
    def cost(self) -> int: ...


InputT = TypeVar("InputT", bound=Costed)
OutputT = TypeVar("OutputT")
# A traced request's span, as a batch links it: its W3C trace id (16 bytes) then its span id (8), big-endian. Bytes,
# so it crosses to a model host process as it is (msgpack holds no 128-bit integer).
TraceRef = bytes


@dataclass(frozen=True, slots=True)
class Schedule:
    """Where a job goes in the queue (docs/architecture.md, "Priority, fair share and deadlines").

    ``priority``: vLLM's request field, lower runs earlier (every ``priority_aging`` seconds it waits raise it by
    one, so none starves). ``key``: the fair-share key (an API key's name; "" when the server asks none) whose
    share of the model the job's items draw on, in proportion to ``weight``. ``timeout``: the seconds the job
    may wait queued before any of its work runs (the request's deadline, or ``max_queue_wait``; None: no limit).
    """

    priority: int = 0
    key: str = ""
    weight: float = 1.0
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class BatchRun:
    """One batch a traced job's items rode in, for its ``batch`` span: when its forward began and ended
    (``time.time_ns()``), its items and padded tokens, how many of them were this job's, the span of every traced job
    in it (``peers``, this one's included), and whether the model failed on it."""

    started_ns: int
    ended_ns: int
    items: int
    padded_tokens: int
    own_items: int
    peers: tuple[TraceRef, ...]
    failed: bool = False


@dataclass(eq=False)
class Job(Generic[InputT, OutputT]):
    """One request's items and their results. The worker thread writes; ``notify`` says it is done.

    ``notify`` is called exactly once, from the worker thread, when every result is in or the job
    failed; it must only schedule a wake-up on the event loop, never block.

    ``queued_at`` and ``started_at`` are the batcher's clock readings when the job was queued and when its
    first item was cut into a batch (None until then): its queue wait, and whether any of its work ran.
    ``model_seconds`` is its share of the forward time of every batch its items rode in, by their tokens (the
    worker adds it before it delivers). ``trace`` names a traced request's span (None: not traced); the worker then
    adds each batch its items rode in to ``runs``, before it delivers.
    """

    inputs: list[InputT]
    notify: Callable[[], None]
    schedule: Schedule = Schedule()
    trace: TraceRef | None = None
    results: list[OutputT | None] = field(init=False)
    error: BaseException | None = field(default=None, init=False)
    cancelled: bool = field(default=False, init=False)
    done: bool = field(default=False, init=False)
    queued_at: float = field(default=0.0, init=False)
    started_at: float | None = field(default=None, init=False)
    model_seconds: float = field(default=0.0, init=False)
    runs: list[BatchRun] = field(default_factory=list, init=False)
    _pending: deque[int] = field(init=False)
    _remaining: int = field(init=False)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.inputs)
        self._pending = deque(sorted(range(len(self.inputs)), key=lambda i: self.inputs[i].cost))
        self._remaining = len(self.inputs)

    def deliver(self, index: int, output: OutputT) -> None:
        if self.done:
            return
        self.results[index] = output
        self._remaining -= 1
        if self._remaining == 0:
            self._finish()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self._finish()

    def _finish(self) -> None:
        self.done = True
        self.notify()


@dataclass(frozen=True, slots=True)
class WorkItem(Generic[InputT, OutputT]):
    """One input of a job, as a batch holds it: the worker runs ``encoded`` and delivers to ``job``."""

    job: Job[InputT, OutputT]
    index: int

    @property
    def encoded(self) -> InputT:
        return self.job.inputs[self.index]
