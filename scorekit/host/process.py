"""The model host process: one model's weights, batcher and worker thread(s), fed token ids by front ends.

Its owner starts it (``python -m scorekit.host --fd N``, N its end of a socket pair) and sends ``Hello`` with the
model's spec; the host loads the full backend, sizes its batches for its device, runs its warm-up forward
(:func:`~scorekit.model_host.warm_up`), starts a :class:`~scorekit.model_host.LocalHost` (the batcher and worker a
server runs in process) and answers ``Ready``.
A model that fails to load is one line in ``Died`` (the owner's error says it) and exit status 1.

Then a reader thread per connection turns ``Submit`` into a :class:`HostJob` (whose end sends ``Done`` or
``Failed`` on that connection), ``Abort`` into a cancel and ``Expire`` into an expiry, while the main thread
waits. With ``--listen-fd M`` (a listening Unix socket: ``scorekit serve --api-processes``, whose supervisor is
the owner), the ready host also accepts front ends there: each sends ``Join``, is answered with the owner's
``Ready`` and is served on a reader thread of its own, its job numbers its own, against the one ``LocalHost``,
so one batcher batches every front end's items together. A joined front end that leaves (its connection closes,
or a write to it fails) has its jobs cancelled, and nothing else ends. What the batches and drops were is told
once (the front ends' metrics add up across processes): to the oldest joined connection still open, else to
the owner; a worker's death to every connection.

The host never outlives its owner: when the owner's socket closes it finishes what is queued for the connections
still open (cancelling the owner's own jobs once a write to it fails: nobody reads their answers) and exits 0,
as on SIGTERM; when its worker dies it sends ``Died`` and exits 1. It ignores SIGINT (``__main__``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import threading
from dataclasses import replace
from types import FrameType

from scorekit.batching import QueueFull
from scorekit.errors import ModelFailure, QueueTimeout, WorkerDied
from scorekit.host import wire
from scorekit.host.channel import Channel
from scorekit.jobs import Schedule, TraceRef
from scorekit.logs import host_logging
from scorekit.model_host import LocalHost, freeze_start_up, warm_up
from scorekit.model_job import ModelJob
from scorekit.models import load_spec
from scorekit.models.base import Encoded
from scorekit.models.budget import batch_token_budget

logger = logging.getLogger("scorekit.host")
# How often the main thread looks at the worker's health while nothing else wakes it.
_HEALTH_POLL = 0.1


class HostJob(ModelJob):
    """A job the front end submitted, answered over the channel when it ends; the front end names it ``number``.

    The batcher marks a job started by setting ``started_at`` when it cuts its first item into a batch, under
    its lock and with no hook; here that assignment also sends ``Started``, so the front end learns the queue
    wait and that the job runs (a client that leaves now is counted as leaving a running job)."""

    def __init__(
        self, number: int, inputs: list[Encoded], schedule: Schedule, server: HostServer, trace: TraceRef | None
    ) -> None:
        self.number = number
        self._server = server
        self._started: float | None = None
        super().__init__(inputs, notify=self._answer, schedule=schedule, trace=trace)

    @property  # the dataclass field of Job, watched
    def started_at(self) -> float | None:
        return self._started

    @started_at.setter
    def started_at(self, value: float | None) -> None:
        if self._started is None and value is not None:
            self._server.channel.send(wire.Started(self.number, value - self.queued_at))
        self._started = value

    def _answer(self) -> None:
        """The job is done or failed (from whichever thread ended it): answer it, unless the front end aborted it."""
        if self._server.jobs.pop(self.number, None) is None:
            return
        error = self.error
        if error is not None:
            failed = wire.Failed(self.number, _kind(error), str(error), self.model_seconds, wire.runs(self.runs))
            self._server.channel.send(failed)
            return
        packed = self._packed
        runs = wire.runs(self.runs)
        if packed is not None and all(output is packed for output in self.results):
            done = wire.Done(self.number, True, [wire.tensor(packed)], self.model_seconds, runs)
        else:
            done = wire.Done(self.number, False, [wire.tensor(row) for row in self.outputs()], self.model_seconds, runs)
        self._server.channel.send(done)


def _kind(error: BaseException) -> wire.FailureKind:
    if isinstance(error, WorkerDied):
        return "worker_died"
    if isinstance(error, QueueTimeout):
        return "queue_timeout"
    if isinstance(error, ModelFailure):
        return "model_error"
    return "overloaded"


def _one_line(exc: Exception) -> str:
    """A load failure as ``scorekit serve`` says one: a ValueError (scorekit's own refusals) its message, anything
    else its type too; the first line of either."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, ValueError) else f"{type(exc).__name__}: {first}".rstrip(": ")


class Connections:
    """The host's connections: its owner's, and the front ends that joined, oldest first."""

    def __init__(self, owner: Channel) -> None:
        self.owner = owner
        self._lock = threading.Lock()  # the reader threads join and leave; any thread reports
        self._joined: list[Channel] = []

    def join(self, channel: Channel) -> None:
        with self._lock:
            self._joined.append(channel)

    def leave(self, channel: Channel) -> None:
        with self._lock:
            self._joined.remove(channel)

    @property
    def joined(self) -> list[Channel]:
        with self._lock:
            return list(self._joined)

    @property
    def reporter(self) -> Channel:
        """The one connection told what the batches and drops were: the oldest joined front end still here (the
        owner of a listener is a supervisor, which keeps no metrics), else the owner."""
        with self._lock:
            return self._joined[0] if self._joined else self.owner


class _Reports:
    """The host's :class:`~scorekit.model_host.HostObserver`: what its batches and drops were, told once, to the
    connection whose engine's observer counts them."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections

    def batch(self, size: int, tokens: int, seconds: float) -> None:
        self._connections.reporter.send(wire.Batch(size, tokens, seconds))

    def dropped(self, items: int) -> None:
        self._connections.reporter.send(wire.Dropped(items))


class HostServer:
    """Serves one connection's messages against the started :class:`LocalHost` that every connection shares."""

    def __init__(self, channel: Channel, local: LocalHost) -> None:
        self.channel = channel
        self.local = local
        # The jobs not yet answered or aborted, by number. The reader thread adds and aborts, a job's end
        # (any thread) removes: each a single dict operation, atomic under the GIL.
        self.jobs: dict[int, HostJob] = {}

    def serve(self) -> None:
        """Until the other end closes its side of the socket."""
        for message in self.channel:
            match message:
                case wire.Submit():
                    self._submit(message)
                case wire.Abort(job=number):
                    if (job := self.jobs.pop(number, None)) is not None:
                        self.local.cancel(job)
                case wire.Expire(job=number):
                    if (job := self.jobs.get(number)) is not None:
                        self.local.expire(job)
                case wire.StatsRequest(request=request):
                    self.channel.send(self._stats(request))
                case _:
                    logger.warning("the model host ignored a message it does not take: %s", type(message).__name__)

    def _submit(self, message: wire.Submit) -> None:
        job = HostJob(message.job, wire.inputs_of(message), wire.schedule_of(message), self, message.trace)
        self.jobs[message.job] = job
        try:
            self.local.submit(job)
        except QueueFull as exc:
            self.jobs.pop(message.job, None)
            self.channel.send(wire.Failed(message.job, "overloaded", str(exc)))

    def _stats(self, request: int) -> wire.Stats:
        now = self.local.snapshot()
        worker = now.worker
        return wire.Stats(
            request,
            now.queued_items,
            now.queued_tokens,
            now.running_batches,
            worker.batches,
            worker.items,
            worker.items_of_cancelled_jobs,
            worker.failed_batches,
            worker.most_busy,
            list(worker.recent_batch_sizes),
            list(worker.recent_batch_jobs),
            worker.busy_seconds,
        )

    def abort_all(self) -> None:
        """Cancel every job: nobody is left to read its answer."""
        for number in list(self.jobs):
            if (job := self.jobs.pop(number, None)) is not None:
                self.local.cancel(job)


def serve_joined(sock: socket.socket, local: LocalHost, ready: wire.Ready, connections: Connections) -> None:
    """A joined front end's thread: its ``Join`` answered with ``ready``, then its messages served until it leaves;
    then its jobs are cancelled (nobody reads their answers) and the reports move on to the next connection."""
    channel = Channel(sock, on_broken=lambda: channel.shutdown(), name="scorekit-host-joined")
    first = channel.receive()
    if not isinstance(first, wire.Join):
        if first is not None:
            logger.warning("a connection to the model host began with %s, not Join: closed", type(first).__name__)
        channel.close(timeout=1.0)
        return
    server = HostServer(channel, local)
    channel.send(ready)
    connections.join(channel)  # after its Ready: no report may come before it
    try:
        server.serve()
    finally:
        connections.leave(channel)  # first: the drops of its own jobs are told to whoever reports now
        server.abort_all()
        channel.close(timeout=5.0)


def _accept(listener: socket.socket, local: LocalHost, ready: wire.Ready, connections: Connections) -> None:
    """The listener's thread: every front end that connects gets a thread of its own, until the listener is shut."""
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:  # shut down: the host is ending
            return
        threading.Thread(
            target=serve_joined, args=(sock, local, ready, connections), name="scorekit-host-joined", daemon=True
        ).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scorekit.host", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="this process's end of its owner's socket pair")
    parser.add_argument("--listen-fd", type=int, help="a listening Unix socket where front ends join, once ready")
    args = parser.parse_args(argv)
    host_logging()
    ended = threading.Event()  # the owner closed, a write to it failed, or SIGTERM
    broken = threading.Event()  # a write to the owner failed: nobody reads its answers

    def broke() -> None:
        broken.set()
        ended.set()

    channel = Channel(socket.socket(fileno=args.fd), on_broken=broke, name="scorekit-host")
    listener = None if args.listen_fd is None else socket.socket(fileno=args.listen_fd)
    hello = channel.receive()
    if not isinstance(hello, wire.Hello):  # the owner went away before it said what to load
        channel.close(timeout=1.0)
        return 0
    connections = Connections(channel)
    try:
        spec = hello.spec
        backend = load_spec(spec)
        budget = batch_token_budget(backend, spec, sharing=hello.sharing)
        local = LocalHost(backend, replace(spec.engine, max_batch_tokens=budget.tokens), _Reports(connections))
        warm_up(backend, budget.tokens)  # before Ready: no front end serves (or is ready) until it ran
        local.start()
    except Exception as exc:
        channel.send(wire.Died(_one_line(exc)))  # the owner says it, once, as its own error
        channel.close(timeout=5.0)
        return 1
    freeze_start_up()
    ready = wire.Ready(backend.name, backend.kind, backend.max_length, budget.tokens, budget.source)
    channel.send(ready)
    server = HostServer(channel, local)

    def read() -> None:
        try:
            server.serve()
        finally:  # a message it cannot read ends the host too, never leaves it waiting
            ended.set()

    def terminate(signum: int, frame: FrameType | None) -> None:
        ended.set()

    signal.signal(signal.SIGTERM, terminate)
    threading.Thread(target=read, name="scorekit-host-reader", daemon=True).start()
    if listener is not None:
        accepting = (listener, local, ready, connections)
        threading.Thread(target=_accept, args=accepting, name="scorekit-host-listener", daemon=True).start()
    while not ended.wait(_HEALTH_POLL):
        health = local.health
        if not health.ready:
            died = wire.Died(f"The model worker died ({type(health.death).__name__}).")
            everyone = [channel, *connections.joined]
            for each in everyone:
                each.send(died)
            for each in everyone:
                each.close(timeout=5.0)
            return 1
    if listener is not None:  # no front end joins a host that is ending
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone would not)
    if broken.is_set():
        server.abort_all()
    local.stop()  # what is queued runs and is answered (or, aborted, stops at the batch running)
    for each in [*connections.joined, channel]:
        each.close(timeout=5.0)
    return 0
