"""Running a built app under uvicorn: the draining shutdown and the server's own settings.

``scorekit serve`` (cli/) parses flags into :class:`~scorekit.settings.Settings` and hands the app here;
everything about the HTTP server process (signals, drain, timeouts, connection limits) lives in this module.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

from scorekit.app import ScorekitApp
from scorekit.connections import AcceptFailureFilter, connection_limits, guarded, raise_open_file_limit
from scorekit.model_host import freeze_start_up

logger = logging.getLogger("scorekit.serving")

# How long the requests cut at the end of a drain get to write their 503 before uvicorn closes up.
CUT_GRACE_S = 2.0
# The exit status of a server whose model host process died (1 is a failed start, 2 a usage error).
HOST_DIED_EXIT = 3


class _DrainingServer(uvicorn.Server):
    """The first SIGTERM/SIGINT drains: new scoring requests get 503 while the listener stays open
    (a load balancer sees the 503s and /health turn away), and the requests admitted before the signal
    finish. Once they have, uvicorn shuts down as usual. At ``shutdown_timeout`` seconds, or at a second
    signal, the requests still running are answered 503 in the JSON error shape and the process exits 0.

    A model host process that dies begins the same drain (its requests in flight have failed with 503 already)
    and the process exits :data:`HOST_DIED_EXIT`: a supervisor restarts the whole server, whose models are then
    all served again, rather than this one restarting a host behind requests it has refused.
    """

    def __init__(self, config: uvicorn.Config, app: ScorekitApp, started: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._scorekit = app
        self._started = started
        self._drain_deadline: float | None = None
        self._announced = False
        self._forced = False
        self.host_died: str | None = None  # the one line naming the dead host, once one has died

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of whatever the event loop was doing: only flags here, on_tick acts.
        # Not uvicorn's handler: it would re-raise the signal once serving ends (a KeyboardInterrupt
        # traceback and a non-zero status after an orderly shutdown).
        if self._drain_deadline is None:
            self._scorekit.drain.begin()
            self._drain_deadline = time.monotonic() + self._scorekit.settings.shutdown_timeout
        else:
            self._forced = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # the lifespan has loaded every model: what start-up made stays for good
            freeze_start_up()
        if self.started and self._started is not None:
            self._started()
        elif self.started and sockets:
            # uvicorn says where it listens only for sockets it bound itself.
            host, port = sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            logger.info("serving on http://%s:%d (Ctrl-C drains; a second Ctrl-C stops at once)", shown, port)

    async def on_tick(self, counter: int) -> bool:
        if self.host_died is None and (line := self._scorekit.dead_host()) is not None:
            self.host_died = line
            logger.critical("%s: draining and exiting with status %d", line, HOST_DIED_EXIT)
            if self._drain_deadline is None:  # a drain already begun keeps its deadline
                self.handle_exit(signal.SIGTERM, None)
        deadline = self._drain_deadline
        if deadline is None:
            return await super().on_tick(counter)
        # This process's own requests: the gate refuses new work before it counts as load, and another front
        # end's requests are its own drain's to wait for.
        admitted = self._scorekit.load.routed_here
        if not self._announced:
            self._announced = True
            timeout = self._scorekit.settings.shutdown_timeout
            logger.info("draining: waiting up to %g s for the %d request(s) in flight to finish", timeout, admitted)
        now = time.monotonic()
        if self._forced:
            await self._cut("a second signal")
        elif now >= deadline:
            await self._cut(f"the shutdown timeout ({self._scorekit.settings.shutdown_timeout:g} s) passed")
        elif admitted:
            return await super().on_tick(counter)
        else:
            # uvicorn's own graceful wait comes after the drain: give it only what is left of the one
            # shutdown_timeout, or a request could run for twice as long as the flag promises.
            self.config.timeout_graceful_shutdown = math.ceil(deadline - now)
        return True

    async def _cut(self, why: str) -> None:
        """Answer what is still running with a JSON 503 now, so uvicorn has nothing left to cancel (it would
        answer a plain-text 500 and log a traceback per request)."""
        cut = await self._scorekit.drain.cut(CUT_GRACE_S)
        logger.warning("%s: answered the %d request(s) still in flight with 503 and shutting down", why, cut)
        self.config.timeout_graceful_shutdown = math.ceil(CUT_GRACE_S)


def run_server(
    app: ScorekitApp,
    *,
    host: str,
    port: int,
    log_level: str,
    log_config: dict[str, Any] | None = LOGGING_CONFIG,
    sock: socket.socket | None = None,
    started: Callable[[], None] | None = None,
) -> int:
    """Serve ``app`` until a signal ends the drain; 0 when the server started, else 1, and
    :data:`HOST_DIED_EXIT` after a model host process died (with its one line on stderr).

    ``log_config`` is uvicorn's (a ``logging.config.dictConfig``; None leaves logging as it is). ``sock``, from
    :func:`~scorekit.connections.bind_listener`, is the socket already bound to ``host``:``port``; without it
    uvicorn binds one itself. ``started`` is called once the server serves, instead of the line saying where (a
    front end of several tells its supervisor, which says it once)."""
    settings = app.settings
    fd_limit = raise_open_file_limit()
    max_connections, backlog = connection_limits(fd_limit, settings.limit_concurrency)
    logger.info(
        "up to %d open connections and a listen backlog of %d (open-file limit %d); a request head must"
        " arrive within %g s",
        max_connections,
        backlog,
        fd_limit,
        settings.header_timeout,
    )
    logging.getLogger("asyncio").addFilter(AcceptFailureFilter())
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=log_config,
        lifespan="on",
        backlog=backlog,
        # asyncio and h11 whatever else is installed (ray[serve] brings uvloop and httptools, which uvicorn would
        # pick): under httptools a client that resets its connection behind a pipelined request goes unnoticed
        # and its work runs to the end; h11 reports it. What the tests and benchmarks measured is what runs.
        loop="asyncio",
        http=guarded(H11Protocol, header_timeout=settings.header_timeout, max_connections=max_connections),
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout),
    )
    server = _DrainingServer(config, app, started)
    server.run(sockets=[sock] if sock is not None else None)
    if server.host_died is not None:
        print(f"scorekit: error: {server.host_died}", file=sys.stderr, flush=True)
        return HOST_DIED_EXIT
    return 0 if server.started else 1
