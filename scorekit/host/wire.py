"""What crosses the boundary between the front end and a model host process: the messages, and how token ids
and outputs travel in them.

Every message is a msgspec Struct of one tagged union, encoded with msgpack; token ids travel as the bytes of
their ``array('i')`` and a job's outputs as one buffer (the packed tensor's bytes, with its dtype and shape), so
nothing on the hot path is pickled and no Python int is made per token. Both ends run on one machine from one
interpreter, so the machine's byte order and int size are the wire's.

The host's owner sends ``Hello`` once; a front end that joins a started host (``--listen-fd``) sends ``Join``
instead. Then each sends ``Submit`` (with the job's schedule), ``Abort``, ``Expire`` and ``StatsRequest``; the host
answers ``Ready`` (or ``Died`` when its model fails to load), then ``Started``, ``Done``, ``Failed`` (both with the
job's model seconds, and for a traced job each batch it rode in), ``Dropped``, ``Batch``, ``Stats`` and, when its
worker dies, ``Died``. A job is named by a number its connection gives it.
"""

from __future__ import annotations

from array import array
from typing import Literal

import msgspec
import torch

from scorekit.jobs import BatchRun, Schedule, TraceRef
from scorekit.models.base import Encoded, SharedPrefix
from scorekit.settings import ModelKind, ModelSpec
from scorekit.worker import WorkerStats

# How a job failed on the host, which the client turns back into the error of ``scorekit.errors``.
FailureKind = Literal["model_error", "worker_died", "queue_timeout", "overloaded"]


class Input(msgspec.Struct, array_like=True):
    """One :class:`~scorekit.models.base.Encoded`: its token ids as ``array('i')`` bytes, and its shared prefix as
    an index into its job's ``prefixes`` (-1: none)."""

    ids: memoryview
    token_types: memoryview | None
    labels: tuple[int, ...]
    truncated: bool
    prefix: int


class Tensor(msgspec.Struct, array_like=True):
    """A CPU tensor as its bytes in row-major order, its dtype's name (``float32``) and its shape."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview


class Run(msgspec.Struct, array_like=True):
    """A :class:`~scorekit.jobs.BatchRun`: one batch a traced job's items rode in."""

    started_ns: int
    ended_ns: int
    items: int
    padded_tokens: int
    own_items: int
    peers: list[bytes]
    failed: bool


class Hello(msgspec.Struct, tag=True, array_like=True):
    """The front end's first message: the model to load, and how many models share its device (the budget)."""

    spec: ModelSpec
    sharing: int


class Join(msgspec.Struct, tag=True, array_like=True):
    """A front end's first message on a connection to a host its owner started: answered with the owner's
    ``Ready``."""


class Ready(msgspec.Struct, tag=True, array_like=True):
    """The host loaded the model and runs batches: its card, and the padded tokens a batch may hold."""

    name: str
    kind: ModelKind
    max_length: int
    max_batch_tokens: int
    budget_source: str


class Submit(msgspec.Struct, tag=True, array_like=True):
    """Queue a job: its inputs, the lengths of the distinct shared prefixes they point to, and its
    :class:`~scorekit.jobs.Schedule` (priority, fair-share key and weight, the seconds it may wait queued), and a
    traced request's span (``trace``: its batches are noted and sent back)."""

    job: int
    inputs: list[Input]
    prefixes: list[int]
    priority: int = 0
    key: str = ""
    weight: float = 1.0
    timeout: float | None = None
    trace: bytes | None = None


class Abort(msgspec.Struct, tag=True, array_like=True):
    """The job's client left: its queued items never run, and the host forgets it (nothing more is sent of it)."""

    job: int


class Expire(msgspec.Struct, tag=True, array_like=True):
    """The job reached its queue-wait deadline: fail it with a queue timeout unless some of it has run."""

    job: int


class StatsRequest(msgspec.Struct, tag=True, array_like=True):
    request: int


class Started(msgspec.Struct, tag=True, array_like=True):
    """The job's first item was cut into a batch, ``waited`` seconds after the host queued it."""

    job: int
    waited: float


class Done(msgspec.Struct, tag=True, array_like=True):
    """Every output of the job: ``packed``, one tensor whose rows are the outputs in input order; else one tensor
    per input (outputs of different shapes). ``model_seconds``: the job's share of its batches' forward time;
    ``runs``: the batches a traced job rode in."""

    job: int
    packed: bool
    outputs: list[Tensor]
    model_seconds: float = 0.0
    runs: list[Run] = msgspec.field(default_factory=list)


class Failed(msgspec.Struct, tag=True, array_like=True):
    """The job failed; ``model_seconds`` is its share of the batches that ran (or failed) with it before then, and
    ``runs`` those batches for a traced job."""

    job: int
    kind: FailureKind
    message: str
    model_seconds: float = 0.0
    runs: list[Run] = msgspec.field(default_factory=list)


class Dropped(msgspec.Struct, tag=True, array_like=True):
    """Queued items of an aborted job were taken out before they ran."""

    items: int


class Batch(msgspec.Struct, tag=True, array_like=True):
    """A batch ran: its items, padded tokens and forward time."""

    size: int
    tokens: int
    seconds: float


class Stats(msgspec.Struct, tag=True, array_like=True):
    """The answer to a ``StatsRequest``: the host's queue, the batches running and its worker's counters."""

    request: int
    queued_items: int
    queued_tokens: int
    running_batches: int
    batches: int
    items: int
    items_of_cancelled_jobs: int
    failed_batches: int
    most_busy: int
    recent_batch_sizes: list[int]
    recent_batch_jobs: list[int]
    busy_seconds: float = 0.0


class Died(msgspec.Struct, tag=True, array_like=True):
    """The host cannot run work (its model failed to load, or its worker died), in one line."""

    message: str


Message = (
    Hello
    | Join
    | Ready
    | Submit
    | Abort
    | Expire
    | StatsRequest
    | Started
    | Done
    | Failed
    | Dropped
    | Batch
    | Stats
    | Died
)


def submit(job: int, inputs: list[Encoded], schedule: Schedule | None = None, trace: TraceRef | None = None) -> Submit:
    """A job's inputs, schedule and trace as a ``Submit``; inputs holding one :class:`SharedPrefix` object point to
    one entry."""
    prefixes: dict[int, int] = {}  # id of a prefix object -> its index in the message
    lengths: list[int] = []
    wired = []
    for item in inputs:
        prefix = -1
        if item.prefix is not None:
            prefix = prefixes.setdefault(id(item.prefix), len(lengths))
            if prefix == len(lengths):
                lengths.append(item.prefix.length)
        types = item.token_type_ids
        wired.append(
            Input(
                memoryview(item.input_ids).cast("B"),
                None if types is None else memoryview(types).cast("B"),
                item.label_token_ids,
                item.truncated,
                prefix,
            )
        )
    placed = Schedule() if schedule is None else schedule
    return Submit(job, wired, lengths, placed.priority, placed.key, placed.weight, placed.timeout, trace)


def schedule_of(message: Submit) -> Schedule:
    """The schedule a ``Submit`` carries."""
    return Schedule(message.priority, message.key, message.weight, message.timeout)


def runs(values: list[BatchRun]) -> list[Run]:
    """A traced job's batches for the wire."""
    return [
        Run(r.started_ns, r.ended_ns, r.items, r.padded_tokens, r.own_items, list(r.peers), r.failed) for r in values
    ]


def batch_runs(values: list[Run]) -> list[BatchRun]:
    """The batches a ``Done`` or ``Failed`` carries."""
    return [
        BatchRun(r.started_ns, r.ended_ns, r.items, r.padded_tokens, r.own_items, tuple(r.peers), r.failed)
        for r in values
    ]


def inputs_of(message: Submit) -> list[Encoded]:
    """The inputs a ``Submit`` carries, with one :class:`SharedPrefix` object per prefix index."""
    prefixes = [SharedPrefix(length) for length in message.prefixes]
    return [
        Encoded(
            _ids(item.ids),
            None if item.token_types is None else _ids(item.token_types),
            item.labels,
            item.truncated,
            None if item.prefix < 0 else prefixes[item.prefix],
        )
        for item in message.inputs
    ]


def _ids(data: memoryview) -> array[int]:
    ids = array("i")
    ids.frombytes(data)
    return ids


def tensor(value: torch.Tensor) -> Tensor:
    """A CPU tensor for the wire, its bytes viewed rather than copied (the message keeps the tensor alive)."""
    value = value.contiguous()
    data = value.reshape(-1).view(torch.uint8).numpy()  # bytes of any dtype, bfloat16 too (numpy has none)
    return Tensor(str(value.dtype).removeprefix("torch."), tuple(value.shape), data.data)


def from_wire(value: Tensor) -> torch.Tensor:
    """The tensor a :class:`Tensor` holds, over its buffer (no copy)."""
    dtype = getattr(torch, value.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a tensor dtype: {value.dtype!r}")
    if not value.data.nbytes:  # torch.frombuffer refuses an empty buffer
        return torch.empty(value.shape, dtype=dtype)
    return torch.frombuffer(value.data, dtype=dtype).reshape(value.shape)


def worker_stats(stats: Stats) -> WorkerStats:
    """The worker's counters a ``Stats`` carries."""
    worker = WorkerStats(
        batches=stats.batches,
        items=stats.items,
        items_of_cancelled_jobs=stats.items_of_cancelled_jobs,
        failed_batches=stats.failed_batches,
        busy_seconds=stats.busy_seconds,
        most_busy=stats.most_busy,
    )
    worker.recent_batch_sizes.extend(stats.recent_batch_sizes)
    worker.recent_batch_jobs.extend(stats.recent_batch_jobs)
    return worker
