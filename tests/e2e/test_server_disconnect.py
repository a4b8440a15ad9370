"""End to end over a real server on a loopback port: a client that hangs up cancels its handler.

The fakes in scorekit.testing model uvicorn's and hypercorn's receive semantics; this test checks the
real thing. A raw socket sends a complete ``POST /score``, waits until the handler runs, then closes.
The handler must be cancelled within 1 s, ``GET /load`` must report 0, and the next request must be
served normally. Servers run in a background thread with their own event loop, bound to 127.0.0.1 on
an ephemeral port, and are shut down at teardown with bounded joins.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import uvicorn
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.http import Request, Response
from scorekit.lifecycle import LifecycleMiddleware
from scorekit.load import LoadCounter
from scorekit.routing import Route, Router

pytestmark = pytest.mark.e2e

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
IO_TIMEOUT = 5.0
# Noticing a closed socket takes milliseconds; the bound is wide so a loaded machine cannot fail it.
NOTICE_TIMEOUT = 10.0


@dataclass
class Handlers:
    """The endpoints and what they saw; the events are set from the server's thread."""

    load: LoadCounter
    started: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancelled_at: float | None = None
    served: int = 0

    async def score(self, request: Request) -> Response:
        payload = json.loads(request.body)
        if not payload.get("slow"):
            self.served += 1
            return Response(json.dumps({"object": "list", "data": [{"index": 0, "score": 1.0}]}).encode())
        self.started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled_at = time.monotonic()
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def server_load(self, request: Request) -> Response:
        # This GET /load request is itself in flight (counted): report the others, as vLLM's /load does.
        return Response(json.dumps({"server_load": self.load.total - 1}).encode())


def build_app() -> tuple[ASGIApp, Handlers]:
    load = LoadCounter()
    handlers = Handlers(load)
    router = Router(
        [Route("POST", "/score", handlers.score), Route("GET", "/load", handlers.server_load)],
        state=None,
        max_body_bytes=1 << 20,
    )
    app = LifecycleMiddleware(router, load=load)

    async def with_lifespan(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # hypercorn always runs lifespan; the router has none
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await app(scope, receive, send)

    return with_lifespan, handlers


def wait_until_listening(port: int, thread: threading.Thread) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the server thread died while starting")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {HOST}:{port}")


@contextmanager
def run_uvicorn(app: ASGIApp) -> Iterator[int]:
    config = uvicorn.Config(app, host=HOST, port=0, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-e2e", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port: int = server.servers[0].sockets[0].getsockname()[1]
        yield port
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT)
        if thread.is_alive():
            server.force_exit = True
            thread.join(START_TIMEOUT)


@contextmanager
def run_hypercorn(app: ASGIApp) -> Iterator[int]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))  # bound here, handed over by fd: no free-port race
    port = listener.getsockname()[1]
    config = HypercornConfig()
    config.bind = [f"fd://{listener.detach()}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    config.graceful_timeout = 1.0
    loop = asyncio.new_event_loop()
    stop: dict[str, asyncio.Event] = {}
    ready = threading.Event()

    async def main() -> None:
        stop["event"] = asyncio.Event()
        ready.set()
        await hypercorn_serve(app, config, shutdown_trigger=stop["event"].wait)  # type: ignore[arg-type]

    def runner() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    thread = threading.Thread(target=runner, name="hypercorn-e2e", daemon=True)
    thread.start()
    try:
        if not ready.wait(START_TIMEOUT):
            raise RuntimeError("hypercorn's loop did not start")
        wait_until_listening(port, thread)
        yield port
    finally:
        if "event" in stop and thread.is_alive():
            loop.call_soon_threadsafe(stop["event"].set)
        thread.join(START_TIMEOUT)


SERVERS = {"uvicorn": run_uvicorn, "hypercorn": run_hypercorn}


@pytest.fixture(params=sorted(SERVERS))
def live(request: pytest.FixtureRequest) -> Iterator[tuple[int, Handlers]]:
    app, handlers = build_app()
    with SERVERS[request.param](app) as port:
        yield port, handlers


def raw_post(port: int, path: str, payload: dict[str, Any]) -> socket.socket:
    """Send one complete POST with a JSON body on a fresh raw socket, and return the open socket."""
    body = json.dumps(payload).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((HOST, port), timeout=IO_TIMEOUT)
    sock.sendall(head + body)
    return sock


def get_json(port: int, method: str, path: str, payload: dict[str, Any] | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(HOST, port, timeout=IO_TIMEOUT)
    try:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {} if body is None else {"Content-Type": "application/json"}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def settled_load(port: int) -> tuple[int, Any]:
    """``GET /load`` once it reads 0, or its last answer after NOTICE_TIMEOUT.

    The -1 runs in the middleware's ``finally``, after the app returned: after a cancel, and also after a
    served request's last byte, which its client can read (and ask ``/load``) a moment before that.
    """
    deadline = time.monotonic() + NOTICE_TIMEOUT
    while True:
        status, body = get_json(port, "GET", "/load")
        if body == {"server_load": 0} or time.monotonic() > deadline:
            return status, body
        time.sleep(0.01)


def test_client_close_cancels_handler(live: tuple[int, Handlers]) -> None:
    port, handlers = live
    sock = raw_post(port, "/score", {"queries": "q", "documents": ["d"], "slow": True})
    try:
        assert handlers.started.wait(IO_TIMEOUT), "the handler never started"
        assert get_json(port, "GET", "/load") == (200, {"server_load": 1})
    finally:
        closed_at = time.monotonic()
        sock.close()
    assert handlers.cancelled.wait(NOTICE_TIMEOUT), "the handler was not cancelled after the client left"
    assert handlers.cancelled_at is not None and handlers.cancelled_at - closed_at < NOTICE_TIMEOUT
    assert settled_load(port) == (200, {"server_load": 0})
    status, body = get_json(port, "POST", "/score", {"queries": "q", "documents": ["d"]})
    assert status == 200
    assert body["data"][0]["score"] == 1.0
    assert handlers.served == 1
    assert settled_load(port) == (200, {"server_load": 0})
