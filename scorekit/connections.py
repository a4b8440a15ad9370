"""Connection limits uvicorn lacks: a deadline for each request head, a cap on open connections, and
enough file descriptors for both. docs/deployment.md ("Connections and descriptors") says why.

uvicorn's HTTP protocols (h11 and httptools) start no timer before a request head is complete, so an
idle or slowloris connection stays open for good, and a flood of them takes every descriptor: accepts
then fail, good clients time out, and asyncio logs a traceback per failed accept. :func:`guarded`
wraps whichever protocol class uvicorn picked with a head deadline and a cap that, when reached,
closes the oldest connection still waiting for its head (an attacker's, not a working client's).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("scorekit.connections")

# Descriptors kept back from connections for the model's files, the log and the event loop.
RESERVED_FDS = 64
# uvicorn's listen backlog, which the open-file limit may lower (see connection_limits).
MAX_BACKLOG = 2048
# One log line per this many seconds for conditions that can recur thousands of times a second.
LOG_EVERY_S = 60.0


def bind_listener(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """The server's socket, bound now (uvicorn makes it listen with its backlog once serving starts).

    ``scorekit serve`` binds before it loads the model, so a busy port or a wrong host is said at once, not
    after a load of minutes, and no other process can take the port while the model loads.

    ``reuse_port``: one of several sockets on the port, one per front-end process (``--api-processes``), among
    which the kernel spreads new connections evenly (SO_REUSEPORT). One socket shared by every front end would
    not: whichever wakes first accepts a whole burst of connections, so one front end would serve them all.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
        raise ValueError(f"cannot listen on {host}:{port}: {why}") from exc
    return sock


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (logging it); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # macOS reports an unlimited hard limit it will not grant
            logger.warning("could not raise the open-file limit from %d to %d", soft, hard)
            return soft
        logger.info("raised the open-file limit from %d to %d", soft, hard)
        return hard
    return soft


def connection_limits(fd_limit: int, requested: int = 0) -> tuple[int, int]:
    """The most open connections and the listen backlog that ``fd_limit`` descriptors allow; ``requested``
    (0: derive it) lowers the first.

    asyncio accepts up to a whole backlog of connections each time the listener is readable, and the cap
    can only close one after its protocol starts, an event-loop iteration or two later. So up to about
    three backlogs' worth of sockets can be open beyond the cap: they come out of the limit too. Running out
    anyway is worse than the refused work: asyncio's accept loop then logs a traceback and schedules a
    retry for every remaining slot of the backlog (CPython's selector_events._accept_connection).
    """
    backlog = min(MAX_BACKLOG, max(16, fd_limit // 16))
    most = max(1, fd_limit - RESERVED_FDS - 3 * backlog)
    if requested > most:
        logger.warning(
            "--limit-concurrency %d needs more than the %d open files allowed; using %d", requested, fd_limit, most
        )
    return (min(requested, most) if requested else most), backlog


class Throttle:
    """Lets one event through per ``period`` seconds and counts the rest."""

    def __init__(self, period: float = LOG_EVERY_S) -> None:
        self.period = period
        self.suppressed = 0
        self._next = 0.0

    def allow(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self.period
        return True


class AcceptFailureFilter(logging.Filter):
    """asyncio logs "socket.accept() out of system resource" with a traceback for every accept that
    fails for want of descriptors, up to a whole listen backlog (2048 under uvicorn) each time the
    listener is readable: tens of thousands of tracebacks a minute. Keep one line per minute."""

    def __init__(self) -> None:
        super().__init__()
        self._throttle = Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("socket.accept() out of system resource"):
            return True
        if not self._throttle.allow():
            return False
        error = record.exc_info[1] if record.exc_info else None
        record.msg = "socket.accept() out of system resource (%s); repeats are logged once a minute"
        record.args = (error,)
        record.exc_info = None
        return True


@dataclass
class _Limits:
    """What the connections of one server share."""

    header_timeout: float
    max_connections: int
    open: int = 0
    waiting: dict[Any, None] = field(default_factory=dict)  # insertion-ordered: the oldest first
    closed: int = 0
    closing_log: Throttle = field(default_factory=Throttle)


class _Guard(asyncio.Protocol):
    """Mixed in before uvicorn's protocol class; uses only the attributes both of them have."""

    limits: _Limits
    # Set by uvicorn's protocol.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any  # the current request-response cycle: a new object once a request head is complete

    _head_timer: asyncio.TimerHandle | None = None
    _counted = False
    _cycle_when_armed: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._counted = True
        self.limits.open += 1
        self._expect_head()
        if self.limits.open > self.limits.max_connections:
            oldest: _Guard = next(iter(self.limits.waiting))  # this one, if no other is waiting
            oldest._close(f"the connection limit ({self.limits.max_connections}) was reached")

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._expect_head()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._cycle_when_armed:
            self._stop_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        super().connection_lost(exc)

    def _expect_head(self) -> None:
        self._cycle_when_armed = self.cycle
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._close, "no request head in time")
        self.limits.waiting[self] = None

    def _stop_waiting(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.limits.waiting.pop(self, None)

    def _release(self) -> None:
        self._stop_waiting()
        if self._counted:
            self._counted = False
            self.limits.open -= 1

    def _close(self, why: str) -> None:
        self._release()  # now, not at connection_lost: the next accept must not pick this one again
        self.transport.close()
        self.limits.closed += 1
        if self.limits.closing_log.allow():
            logger.warning(
                "closed a connection that sent no complete request head: %s (%d so far)", why, self.limits.closed
            )


def guarded(base: type[asyncio.Protocol], *, header_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's h11 or httptools protocol) with a head deadline and a connection cap."""
    limits = _Limits(header_timeout=header_timeout, max_connections=max_connections)
    return type(f"Guarded{base.__name__}", (_Guard, base), {"limits": limits})
