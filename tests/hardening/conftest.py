"""Helpers for the hardening tests: real servers (``tests.live.serve``), raw sockets, the error shape, metrics.

Everything runs over loopback against the embedded MiniLM model unless a test says otherwise. The raw-socket
helpers are here (not in tests/live.py) because these tests need to stop sending the moment the server answers
(an early 413), and to close a connection at a chosen moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scorekit.api.routes import ROUTES
from scorekit.app import ScorekitApp, create_app
from scorekit.http import Request, Response
from scorekit.routing import Alias, Route
from scorekit.settings import Settings
from tests.live import Live, read_response, serve

TASKS_PATH = "/_hardening/tasks"

# What an error message must never show: a traceback, a memory address, a filesystem path.
_LEAKS = (
    re.compile(r"Traceback|File \"", re.IGNORECASE),
    re.compile(r"0x[0-9a-fA-F]{4,}"),
    re.compile(r"(?<![\w.])/(?:home|root|usr|tmp|work|opt|var|etc|proc|lib|srv|mnt)/"),
    re.compile(r"site-packages|[A-Za-z]:\\\\"),
)


async def _count_tasks(request: Request) -> Response:
    """Runs on the server's own event loop, so ``all_tasks`` there is the server's task count."""
    return Response(json.dumps({"tasks": len(asyncio.all_tasks())}).encode())


PROBE_ROUTES: tuple[Route | Alias, ...] = (
    *ROUTES,
    Route(
        "GET",
        TASKS_PATH,
        _count_tasks,
        summary="Test only: asyncio tasks.",
        counts_as_load=False,
        refused_while_draining=False,
    ),
)


@contextlib.contextmanager
def running(settings: Settings) -> Iterator[tuple[ScorekitApp, Live]]:
    """A real uvicorn in a thread serving ``settings`` (plus the task-count probe route)."""
    app = create_app(settings, routes=PROBE_ROUTES)
    with serve(app) as live:
        yield app, live


@pytest.fixture(scope="session")
def hardened() -> Iterator[tuple[ScorekitApp, Live]]:
    """The embedded model with the default settings, shared by the tests that do not change them."""
    with running(Settings()) as started:
        yield started


def docs(n: int, words: int = 6) -> list[str]:
    return [" ".join(f"w{(i * 7 + j) % 97}" for j in range(words)) + f" doc {i}" for i in range(n)]


# -- the error shape ------------------------------------------------------------------------------------


def assert_no_leak(text: str) -> None:
    for pattern in _LEAKS:
        assert not pattern.search(text), f"leaks {pattern.pattern!r}: {text!r}"


def error_of(status: int, body: bytes, expected: int) -> dict[str, Any]:
    """The ``error`` object of a response that must be ``expected`` in the JSON error shape."""
    assert status == expected, (status, body[:500])
    payload = json.loads(body)
    assert set(payload) == {"error"}, payload
    error: dict[str, Any] = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == status
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert_no_leak(error["message"])
    return error


# -- raw sockets ----------------------------------------------------------------------------------------


def request_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def json_head(path: str, body: bytes) -> bytes:
    return request_head("POST", path, {"Content-Type": "application/json", "Content-Length": str(len(body))})


def reset(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER 0): the rudest way a client can leave."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def send_until_answered(
    live: Live, head: bytes, pieces: Iterator[bytes], *, timeout: float = 30.0
) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` then ``pieces`` until the server starts answering, then read that one response.

    Stopping at the first response byte is what a well-behaved client does with an early 413; pushing
    the rest of a 50 MB body at a server that has already answered only races its close.
    """
    deadline = time.monotonic() + timeout
    with socket.create_connection((live.host, live.port), timeout=timeout) as sock:
        sock.sendall(head)
        for piece in pieces:
            readable, _, _ = select.select([sock], [], [], 0.01)
            if readable:
                break
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the server neither read the body nor answered")
        return read_response(sock)


# -- metrics and the process ------------------------------------------------------------------------------

Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(live: Live) -> dict[Sample, float]:
    """Every sample of /metrics, keyed by (sample name, sorted labels)."""
    status, headers, raw = live.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(raw.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def server_tasks(live: Live) -> int:
    status, payload = live.json("GET", TASKS_PATH)
    assert status == 200
    count: int = payload["tasks"]
    return count


def rss_kib() -> int:
    """This process's resident set (the servers run in-thread, so it includes theirs)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")
