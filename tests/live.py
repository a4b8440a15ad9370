"""Real servers on free loopback ports, each in its own thread and event loop, for end-to-end tests.

``serve(app, server)`` runs ``app`` under uvicorn, hypercorn or granian (granian's embedded server), with the
lifespan, and yields a :class:`Live`: blocking JSON helpers over urllib, plus raw-socket helpers for what
urllib cannot do (a body in timed pieces, chunked transfer encoding, closing the socket mid-request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from scorekit.app import ScorekitApp
    from scorekit.engine import EngineSnapshot
    from scorekit.worker import WorkerStats

SERVERS = ("uvicorn", "hypercorn", "granian")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Live:
    """A started server: its base URL and small blocking HTTP helpers."""

    host: str
    port: int
    server: str = "uvicorn"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> tuple[int, dict[str, str], bytes]:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        sent = {"content-type": "application/json"} if data is not None else {}
        sent.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
        except urllib.error.HTTPError as error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()

    def json(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        status, _, raw = self.request(method, path, body, **kwargs)
        return status, json.loads(raw) if raw else None

    def load(self) -> int:
        status, payload = self.json("GET", "/load")
        assert status == 200
        value: int = payload["server_load"]
        return value

    def wait_load(self, expected: int, timeout: float = 5.0) -> int:
        deadline = time.monotonic() + timeout
        while (value := self.load()) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return value

    # -- raw sockets ---------------------------------------------------------------------------------

    def connect(self, timeout: float = 60) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=timeout)

    def send_json(self, path: str, payload: Any) -> socket.socket:
        """POST ``payload`` over a raw socket and leave it open: a client that can leave mid-request."""
        body = json.dumps(payload).encode()
        sock = self.connect()
        sock.sendall(http_head("POST", path, {"Content-Type": "application/json", "Content-Length": str(len(body))}))
        sock.sendall(body)
        return sock

    def raw(self, pieces: list[bytes], *, pause: float = 0.0, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
        """Send ``pieces`` one ``sendall`` each, ``pause`` seconds apart, then read one response."""
        with self.connect(timeout) as sock:
            for i, piece in enumerate(pieces):
                if i and pause:
                    time.sleep(pause)
                sock.sendall(piece)
            return read_response(sock)


def http_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    """A request line and headers (``Host`` and ``Connection: close`` added) for a raw socket."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(pieces: list[bytes]) -> list[bytes]:
    """``pieces`` as Transfer-Encoding: chunked frames, the terminating zero-size chunk last."""
    return [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces if piece] + [b"0\r\n\r\n"]


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response: status, lower-cased headers, and the body (sized, chunked or to EOF)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError(f"connection closed before the response headers: {data!r}")
        data += got
    head, rest = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()

    def more() -> bytes:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError("connection closed in the middle of the response body")
        return got

    if "content-length" in headers:
        size = int(headers["content-length"])
        while len(rest) < size:
            rest += more()
        return status, headers, rest[:size]
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += more()
            size_line, rest = rest.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                return status, headers, body
            while len(rest) < size + 2:
                rest += more()
            body, rest = body + rest[:size], rest[size + 2 :]
    while got := sock.recv(65536):
        rest += got
    return status, headers, rest


def wait_for(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.005) -> bool:
    """Poll ``condition`` until it is truthy or ``timeout`` passes; return whether it became truthy."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


@contextlib.contextmanager
def serve(app: ASGIApp, server: str = "uvicorn", *, lifespan: bool = True) -> Iterator[Live]:
    """Run ``app`` under a real server in a background thread until the block ends."""
    port = free_port()
    if server == "uvicorn":
        runner = _uvicorn(app, port, lifespan)
    elif server == "hypercorn":
        runner = _hypercorn(app, port)  # hypercorn always runs the lifespan
    elif server == "granian":
        runner = _granian(app, port, lifespan)
    else:
        raise ValueError(server)
    with runner:
        yield Live("127.0.0.1", port, server)


@contextlib.contextmanager
def _uvicorn(app: ASGIApp, port: int, lifespan: bool) -> Iterator[None]:
    # As `scorekit serve` runs it (scorekit/serving.py): asyncio and h11, even where uvloop and httptools are installed.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        lifespan="on" if lifespan else "off",
        log_level="warning",
        loop="asyncio",
        http="h11",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        _wait_until(lambda: server.started or not thread.is_alive(), "uvicorn did not start")
        assert server.started, "uvicorn failed to start"
        yield
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def _hypercorn(app: ASGIApp, port: int) -> Iterator[None]:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(
            hypercorn_serve(app, config, shutdown_trigger=stop.wait, mode="asgi")  # type: ignore[arg-type]
        )

    thread = threading.Thread(target=run, name="hypercorn", daemon=True)
    thread.start()
    try:
        _wait_until(lambda: _accepts(port) or not thread.is_alive(), "hypercorn did not start")
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


class _LifespanWatch:
    """Passes everything through; notes when the app reports its lifespan startup complete or failed.

    granian listens before the lifespan has run, so accepting connections does not mean the model is
    loaded. HTTP scopes go to the app untouched (same scope, receive and send objects).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.done = threading.Event()
        self.failed: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watched_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                self.failed = str(message.get("message", ""))
            await send(message)
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                self.done.set()

        await self.app(scope, receive, watched_send)


@contextlib.contextmanager
def _granian(app: ASGIApp, port: int, lifespan: bool) -> Iterator[None]:
    """granian's embedded server (granian.server.embed.Server) on its own asyncio loop in a thread."""
    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    watch = _LifespanWatch(app)
    loop = asyncio.new_event_loop()
    server = Server(
        target=watch,
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI if lifespan else Interfaces.ASGINL,
        log_level=LogLevels.warning,
    )

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="granian", daemon=True)
    thread.start()
    try:
        ready = watch.done.is_set if lifespan else lambda: _accepts(port)
        _wait_until(lambda: ready() or not thread.is_alive(), "granian did not start")
        assert thread.is_alive() and watch.failed is None, f"granian failed to start: {watch.failed}"
        _wait_until(lambda: _accepts(port) or not thread.is_alive(), "granian does not accept connections")
        yield
    finally:
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(server.stop)
        thread.join(30)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _wait_until(condition: Any, message: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.02)


def settled_stats(app: ScorekitApp) -> WorkerStats:
    """A copy of the worker's counters at their final values: no request in flight, nothing queued and no batch
    running. A batch updates several counters under the worker's lock, and a batch of a request whose client left
    still runs after its answer, so counters read while work may run can be short, or half of one update."""
    engine = app.engine
    assert engine is not None
    settled: list[EngineSnapshot] = []

    def idle() -> bool:
        now = engine.snapshot()  # its counters read with the busy count, under the lock both are written under
        if app.load.routed == 0 and now.idle:
            settled.append(now)
            return True
        return False

    # Twice, a moment apart: a thread that has just taken a batch off the queue counts itself busy a moment later.
    assert wait_for(idle)
    time.sleep(0.05)
    assert wait_for(idle)
    return settled[-1].worker


def settled_items(app: ScorekitApp) -> int:
    """The worker's item count once nothing can change it (:func:`settled_stats`)."""
    return settled_stats(app).items


def close_answers(got: Any, expected: Any, abs_tol: float = 1e-5) -> bool:
    """Two served answers (JSON values) are the same, each float to ``abs_tol``. Two requests' items can run in
    batches of other sizes and partners, which moves a score or a vector's component in its last bits (by at
    most 1e-5, docs/api.md); everything else (indices, documents, keys) must match exactly."""
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(close_answers(got[k], expected[k], abs_tol) for k in got)
    if isinstance(got, list | tuple) and isinstance(expected, list | tuple):
        return len(got) == len(expected) and all(
            close_answers(a, b, abs_tol) for a, b in zip(got, expected, strict=True)
        )
    if isinstance(got, float) or isinstance(expected, float):
        numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (got, expected))
        return numbers and math.isclose(got, expected, abs_tol=abs_tol)
    return bool(got == expected)
