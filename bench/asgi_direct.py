"""Each overhead app driven in-process through fake ASGI messages: the stack's cost with no socket.

Over HTTP, uvicorn's own parsing (h11 here: httptools is not installed) dilutes every framework
difference. Calling the ASGI app directly with a scripted ``receive``/``send`` isolates what the
framework itself adds per request, which is what a profile of a miss needs.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

from bench.apps import FACTORIES
from bench.corpus import trivial_body
from scorekit.asgi import ASGIApp, Message


def _scope(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/score",
        "raw_path": b"/score",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def _one(app: ASGIApp, scope: dict[str, Any], body: bytes) -> None:
    """One request as uvicorn delivers it: the body, then ``http.disconnect`` once the response is done."""
    complete = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await complete.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            complete.set()

    await app(dict(scope), receive, send)


async def _time(app: ASGIApp, requests: int) -> float:
    body = json.dumps(trivial_body()).encode()
    scope = _scope(body)
    for _ in range(min(200, requests)):
        await _one(app, scope, body)
    started = time.process_time()
    for _ in range(requests):
        await _one(app, scope, body)
    return (time.process_time() - started) / requests


def microseconds_per_request(requests: int, repeats: int = 3) -> dict[str, float]:
    """The median over ``repeats`` interleaved passes, per app, in microseconds of this process's CPU time
    (other jobs on a shared machine stretch wall time, not the CPU a request takes)."""
    apps: dict[str, ASGIApp] = {name: factory() for name, factory in FACTORIES.items()}
    runs: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(repeats):
        for name, app in apps.items():
            runs[name].append(asyncio.run(_time(app, requests)) * 1e6)
    return {name: statistics.median(values) for name, values in runs.items()}
