"""Real servers on free loopback ports, each in its own thread and event loop, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from scorekit.asgi import ASGIApp

SERVERS = ("uvicorn", "hypercorn")


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


@contextlib.contextmanager
def serve(app: ASGIApp, server: str = "uvicorn", *, lifespan: bool = True) -> Iterator[Live]:
    """Run ``app`` under a real server in a background thread until the block ends."""
    port = free_port()
    if server == "uvicorn":
        runner = _uvicorn(app, port, lifespan)
    elif server == "hypercorn":
        runner = _hypercorn(app, port)  # hypercorn always runs the lifespan
    else:
        raise ValueError(server)
    with runner:
        yield Live("127.0.0.1", port)


@contextlib.contextmanager
def _uvicorn(app: ASGIApp, port: int, lifespan: bool) -> Iterator[None]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on" if lifespan else "off", log_level="warning")
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
