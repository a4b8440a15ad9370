"""The front end's side of a model host process: :class:`HostClient`, a :class:`~scorekit.model_host.ModelHost`
whose batches run in a process of its own (``--model-host process``, and always with ``--api-processes``).

The engine submits its jobs here as it would to a :class:`~scorekit.model_host.LocalHost`; the client gives each
a number, sends its token ids down and answers it from what the host sends back, on a reader thread. Nothing it
does blocks the event loop but a ``snapshot`` (a bounded round trip, for tests and benchmarks; the metrics'
gauges read :meth:`HostClient.queue`, the books kept here): sends go through the channel's writer thread.

A client either owns its host (it starts the process, and the host ends when this client stops; given a
``listener``, the host also lets front ends join there) or joins one that another started (``address``: it
connects, and stopping closes only its own connection).

``max_queued_items`` is enforced here on the items of the jobs outstanding (submitted and neither answered nor
aborted), which holds the host's queue within it; unlike a batcher in process it also counts the items of a
batch running until the job is answered. The books are two cells (``scorekit.load``): given the cells of a load
board, the outstanding items and tokens are those of every front end, so the limit and the gauges are the
server's. When the host process exits or the socket breaks, every outstanding job fails with
:class:`~scorekit.errors.WorkerDied` at once, ``health`` turns false with the reason, and later submits are
refused.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import scorekit
from scorekit.batching import QueueFull
from scorekit.errors import ModelFailure, Overloaded, QueueTimeout, WorkerDied
from scorekit.host import wire
from scorekit.host.channel import Channel
from scorekit.load import Cell, LocalCell
from scorekit.model_host import Card, Health, HostObserver, HostSnapshot
from scorekit.model_job import ModelJob
from scorekit.models.budget import TokenBudget
from scorekit.settings import ModelSpec
from scorekit.worker import WorkerStats

logger = logging.getLogger("scorekit.host")
# Seconds to learn a dead host's exit status before its death is told without it.
_EXIT_STATUS_WAIT = 0.5
# Seconds a host that failed to start gets to exit on its own (it has said why) before it is killed.
_FAILED_START_EXIT = 10.0


class HostStartError(RuntimeError):
    """The model host process did not become ready: its one line (a load error), or how it ended."""


class HostClient:
    """A model host process for ``spec``, started by :meth:`start`; ``sharing`` models share its device (the host
    sizes its batches' budget for its share). Batches and drops the host reports go to ``observer``.

    ``listener``, a listening Unix socket, is handed to the host, which lets front ends join there once ready;
    the host's copy is then the only one (this one is closed at the start), so once the host has ended a front
    end that joins is refused at once rather than left waiting. ``address``: join the host listening there
    instead of starting one. ``cells``: where the outstanding items and tokens are counted (a load board's, to
    count every front end's); by default this client's alone. ``request_cells``: likewise for the outstanding jobs
    none of whose items has run yet, and those with one run or running (:meth:`requests`)."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        observer: HostObserver,
        sharing: int = 1,
        start_timeout: float = 600.0,
        stats_timeout: float = 1.0,
        listener: socket.socket | None = None,
        address: str | None = None,
        cells: tuple[Cell, Cell] | None = None,
        request_cells: tuple[Cell, Cell] | None = None,
    ) -> None:
        if listener is not None and address is not None:
            raise ValueError("a client that joins a host at an address cannot hand that host a listener")
        self._spec = spec
        self._observer = observer
        self._sharing = sharing
        self._start_timeout = start_timeout
        self._stats_timeout = stats_timeout
        self._listener = listener
        self._address = address
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: Channel | None = None
        self._reader: threading.Thread | None = None
        self._ready: wire.Ready | None = None
        self._lock = threading.Lock()  # the books below: the loop submits and aborts, the reader answers
        self._numbers = itertools.count()
        self._jobs: dict[int, ModelJob] = {}
        self._number_of: dict[ModelJob, int] = {}
        # The items and tokens of the jobs in _jobs (with a board's cells, every front end's jobs too).
        self._items, self._tokens = cells if cells is not None else (LocalCell(), LocalCell())
        # The jobs in _jobs that wait for their first batch, and those with a batch run or running.
        self._waiting, self._running_jobs = request_cells if request_cells is not None else (LocalCell(), LocalCell())
        self._running = False
        self._stopping = False
        self._death: WorkerDied | None = None
        self._stats: dict[int, tuple[threading.Event, list[wire.Stats]]] = {}
        self._last_worker = WorkerStats()

    @property
    def pid(self) -> int | None:
        """The host process's id once started (None for a client that joined)."""
        return None if self._process is None else self._process.pid

    @property
    def exit_status(self) -> int | None:
        """The host process's exit status once it has ended and been waited for (negative: the signal that ended
        it); None while it runs, and for a client that joined."""
        return None if self._process is None else self._process.poll()

    @property
    def card(self) -> Card:
        """The model the host loaded, as it said when ready."""
        ready = self._started()
        return Card(ready.name, ready.kind, ready.max_length)

    @property
    def budget(self) -> TokenBudget:
        """The padded tokens a batch may hold, as the host sized them for its device."""
        ready = self._started()
        return TokenBudget(ready.max_batch_tokens, ready.budget_source)

    def _started(self) -> wire.Ready:
        if self._ready is None:
            raise RuntimeError("the model host has not started")
        return self._ready

    def start(self) -> None:
        """Start the host process, or join the one at ``address``, and wait until it is ready (at most
        ``start_timeout``); raises :class:`HostStartError` with its one line, and its exit status, when it is not."""
        if self._address is not None:
            self._join(self._address)
            return
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-m", "scorekit.host", "--fd", str(theirs.fileno())]
        passed = [theirs.fileno()]
        if self._listener is not None:
            command += ["--listen-fd", str(self._listener.fileno())]
            passed.append(self._listener.fileno())
        process = self._process = subprocess.Popen(command, pass_fds=passed, env=_same_scorekit())
        theirs.close()  # the host's end lives in the host alone, so its exit ends the stream here
        if self._listener is not None:
            self._listener.close()  # likewise: once the host has ended, nothing accepts and a join is refused
        channel = self._channel = Channel(ours, on_broken=self._lost, name="scorekit-host-client")
        reply, late = self._handshake(channel, wire.Hello(self._spec, self._sharing))
        if not isinstance(reply, wire.Ready):
            self._abandon(kill=late)  # a host still loading would notice only once it has loaded
            if isinstance(reply, wire.Died):
                raise HostStartError(f"{reply.message} (the model host exited with status {process.returncode})")
            if late:
                raise HostStartError(f"the model host was not ready within {self._start_timeout:g} s")
            raise HostStartError(f"the model host exited with status {process.returncode} before it was ready")
        self._run(channel, reply)

    def _join(self, address: str) -> None:
        """Connect to the host listening at ``address``, say ``Join`` and wait for its ``Ready``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._start_timeout)
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            raise HostStartError(f"no model host listens at {address} ({exc.strerror or exc})") from None
        sock.settimeout(None)
        channel = self._channel = Channel(sock, on_broken=self._lost, name="scorekit-host-client")
        reply, late = self._handshake(channel, wire.Join())
        if not isinstance(reply, wire.Ready):
            self._stopping = True  # its end is no death to report: start() raises
            channel.close(timeout=1.0)
            if isinstance(reply, wire.Died):
                raise HostStartError(f"{reply.message} (the model host at {address})")
            if late:
                raise HostStartError(f"the model host at {address} did not answer within {self._start_timeout:g} s")
            raise HostStartError(f"the model host at {address} closed the connection before it was ready")
        self._run(channel, reply)

    def _handshake(self, channel: Channel, first: wire.Message) -> tuple[wire.Message | None, bool]:
        """Send ``first`` and wait at most ``start_timeout`` for the answer: it (None at the stream's end), and
        whether the wait ran out."""
        channel.send(first)
        answer: list[wire.Message | None] = []
        handshake = threading.Thread(target=lambda: answer.append(channel.receive()), daemon=True)
        handshake.start()
        handshake.join(self._start_timeout)
        return (answer[0] if answer else None), handshake.is_alive()

    def _run(self, channel: Channel, ready: wire.Ready) -> None:
        """The host is ready: start reading its answers."""
        self._ready = ready
        self._running = True
        self._reader = threading.Thread(
            target=self._read, args=(channel,), name="scorekit-host-client-reader", daemon=True
        )
        self._reader.start()

    def _abandon(self, *, kill: bool) -> None:
        """Close the socket and make sure the process has ended: killed now, or when it does not end on its own."""
        assert self._channel is not None and self._process is not None
        self._stopping = True  # its end is no death to report: start() raises
        self._channel.close(timeout=1.0)
        if kill:
            self._process.kill()
        try:
            self._process.wait(_FAILED_START_EXIT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def stop(self, timeout: float | None = None) -> None:
        """Stop sending work; the host finishes what is queued and exits. Waits at most ``timeout`` for it, then
        kills it; any job still outstanding then fails. A client that joined closes only its connection."""
        if self._address is not None:
            self._leave(timeout)
            return
        if self._channel is None or self._process is None:
            return
        self._stopping = True
        self._channel.close_write(timeout)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("the model host did not stop within %s s: killed", timeout)
            self._process.kill()
            self._process.wait()
        if self._reader is not None:  # the answers the host sent before it exited are read to the end first
            self._reader.join(_EXIT_STATUS_WAIT)
        self._channel.close(timeout=1.0)
        self._running = False
        self._fail_outstanding(WorkerDied("The model host stopped."))

    def _leave(self, timeout: float | None) -> None:
        """Close this connection: the host cancels its jobs (nobody will read their answers) and closes its side,
        which ends the reader (waited for at most ``timeout``); any job still outstanding then fails."""
        if self._channel is None:
            return
        self._stopping = True
        self._channel.close_write(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        self._channel.close(timeout=1.0)
        self._running = False
        self._fail_outstanding(WorkerDied("This front end left the model host."))

    @property
    def health(self) -> Health:
        return Health(self._running and self._death is None, self._death)

    @property
    def death_line(self) -> str | None:
        """Once the host has died while serving, the one line a server that ends for it says: its model and its
        exit status (a client that joined knows only that the connection was lost); None while it lives."""
        if self._death is None:
            return None
        status = self.exit_status
        how = "lost its connection" if status is None else f"exited with status {status}"
        return f"the model host process of model {self._spec.served_name!r} {how}"

    def submit(self, job: ModelJob) -> None:
        """Send the job down, or raise :class:`QueueFull` now: past ``max_queued_items`` (the cells' total: with a
        board's, over every front end), or with no host to run it.

        The total is read without a lock between processes, so front ends that admit at the same instant can pass
        the limit together by a job each; the host's own batcher then refuses what does not fit (``overloaded``)."""
        number = next(self._numbers)
        message = wire.submit(number, job.inputs, job.schedule, job.trace)
        limit = self._spec.engine.max_queued_items
        with self._lock:
            if not self._running or self._death is not None:
                raise QueueFull("the model host is not running")
            queued = self._items.value
            if queued + len(job.inputs) > limit:
                raise QueueFull(f"{queued} items are queued; the limit is {limit}")
            if not job.inputs:  # nothing to run: done now, as a batcher does it
                job._finish()
                return
            job.queued_at = time.monotonic()
            self._jobs[number] = job
            self._number_of[job] = number
            self._book([job], 1)
        assert self._channel is not None
        self._channel.send(message)

    def cancel(self, job: ModelJob) -> None:
        """Abort the job: the host drops its queued items (and reports them to the observer) and sends nothing
        more of it."""
        with self._lock:
            job.cancelled = True
            number = self._forget(job)
        if number is not None and self._channel is not None:
            self._channel.send(wire.Abort(number))

    def expire(self, job: ModelJob) -> None:
        """Ask the host to fail the job with a queue timeout unless some of it has run (the host's batcher knows)."""
        with self._lock:
            number = self._number_of.get(job)
        if number is not None and self._channel is not None:
            self._channel.send(wire.Expire(number))

    def snapshot(self) -> HostSnapshot:
        """The host's queue and its worker's counters, asked for and waited on (at most ``stats_timeout``); once
        the host is gone or silent, this client's own books and the last counters the host sent."""
        event = threading.Event()
        answer: list[wire.Stats] = []
        request = next(self._numbers)
        with self._lock:
            alive = self._running and self._death is None
            if alive:
                self._stats[request] = (event, answer)
        if alive and self._channel is not None:
            self._channel.send(wire.StatsRequest(request))
            event.wait(self._stats_timeout)
        with self._lock:
            self._stats.pop(request, None)
            if not answer:
                return HostSnapshot(self._items.here, self._tokens.here, 0, self._last_worker.copy())
        stats = answer[0]
        worker = self._last_worker = wire.worker_stats(stats)
        return HostSnapshot(stats.queued_items, stats.queued_tokens, stats.running_batches, worker.copy())

    def queue(self) -> tuple[int, int]:
        """The items and tokens of the jobs outstanding on the books (a batch running included; with a board's
        cells, every front end's): no round trip, so the metrics' gauges never wait on the host."""
        with self._lock:  # the two of one moment, as far as this process goes
            return self._items.value, self._tokens.value

    def requests(self) -> tuple[int, int]:
        """The jobs outstanding on the books that wait for their first batch, and those with a batch run or
        running (with a board's cells, every front end's): no round trip, as :meth:`queue`."""
        with self._lock:
            return self._waiting.value, self._running_jobs.value

    def _book(self, jobs: list[ModelJob], sign: int) -> None:
        """Count the jobs' items and tokens in (``sign`` 1) or out (-1) of the books, and the jobs themselves as
        waiting or running, under the lock: the one writer of this process's share."""
        self._items.add(sign * sum(len(job.inputs) for job in jobs))
        self._tokens.add(sign * sum(item.cost for job in jobs for item in job.inputs))
        waiting = sum(job.started_at is None for job in jobs)
        self._waiting.add(sign * waiting)
        self._running_jobs.add(sign * (len(jobs) - waiting))

    def _forget(self, job: ModelJob) -> int | None:
        """Take the job off the books (under the lock); its number, or None when it was not on them."""
        number = self._number_of.pop(job, None)
        if number is not None:
            del self._jobs[number]
            self._book([job], -1)
        return number

    def _take(self, number: int) -> ModelJob | None:
        with self._lock:
            job = self._jobs.get(number)
            if job is not None:
                self._forget(job)
            return job

    def _read(self, channel: Channel) -> None:
        """The reader thread: answer jobs from what the host sends, until the stream ends."""
        try:
            for message in channel:
                self._handle(message)
        except Exception:
            logger.exception("the model host sent what this client cannot read")
        self._lost()

    def _handle(self, message: wire.Message) -> None:
        match message:
            case wire.Started(job=number, waited=waited):
                with self._lock:  # the job moves from waiting to running on the books at once
                    job = self._jobs.get(number)
                    if job is not None and job.started_at is None:
                        job.started_at = job.queued_at + waited
                        self._waiting.add(-1)
                        self._running_jobs.add(1)
            case wire.Done(job=number):
                if (job := self._take(number)) is not None:
                    job.model_seconds = message.model_seconds  # before the last delivery wakes its waiter
                    job.runs.extend(wire.batch_runs(message.runs))
                    _deliver(job, message)
            case wire.Failed(job=number, kind=kind, message=text):
                if (job := self._take(number)) is not None:
                    job.model_seconds = message.model_seconds
                    job.runs.extend(wire.batch_runs(message.runs))
                    job.fail(self._error(kind, text, job))
            case wire.Dropped(items=items):
                self._observer.dropped(items)
            case wire.Batch(size=size, tokens=tokens, seconds=seconds):
                self._observer.batch(size, tokens, seconds)
            case wire.Stats(request=request):
                with self._lock:
                    waiter = self._stats.get(request)
                if waiter is not None:
                    waiter[1].append(message)
                    waiter[0].set()
            case wire.Died(message=text):
                self._die(text)
            case _:
                logger.warning("the model host sent a message a client does not take: %s", type(message).__name__)

    def _error(self, kind: wire.FailureKind, message: str, job: ModelJob) -> Exception:
        limits = [limit for limit in (job.schedule.timeout, self._spec.engine.max_queue_wait) if limit is not None]
        if kind == "queue_timeout" and limits:
            return QueueTimeout(min(limits))
        if kind == "worker_died":
            return WorkerDied(message)
        if kind == "model_error":
            return ModelFailure(message)
        return Overloaded(message)

    def _lost(self) -> None:
        """The stream ended or a write failed: unless this client is stopping, the host is dead."""
        if self._stopping:
            return
        status = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = self._process.wait(_EXIT_STATUS_WAIT)
        how = "lost its connection" if status is None else f"exited with status {status}"
        self._die(f"The model host process {how}.")

    def _die(self, reason: str) -> None:
        """Fail every outstanding job with ``reason`` now; the host runs nothing more."""
        with self._lock:
            if self._death is not None:
                return
            self._death = WorkerDied(reason)
        logger.critical("the model host of %s died: %s", self._spec.served_name, reason)
        self._fail_outstanding(self._death)

    def _fail_outstanding(self, error: WorkerDied) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
            self._number_of.clear()
            self._book(jobs, -1)
            waiters = list(self._stats.values())
        for job in jobs:
            job.fail(error)
        for event, _ in waiters:
            event.set()


def _same_scorekit() -> dict[str, str]:
    """This environment, with the folder this scorekit was imported from first on the host's path: the two ends of
    the wire run the same code, wherever the front end found it."""
    env = dict(os.environ)
    root = str(Path(scorekit.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _deliver(job: ModelJob, done: wire.Done) -> None:
    """Every output of a ``Done`` to its job, row by row (the job packs them into one tensor of its own)."""
    if done.packed:
        rows = wire.from_wire(done.outputs[0]).unbind()
    else:
        rows = tuple(wire.from_wire(output) for output in done.outputs)
    for index, row in enumerate(rows):
        job.deliver(index, row)
