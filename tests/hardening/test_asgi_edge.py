"""The ASGI edge under uvicorn, hypercorn and granian: what reaches scorekit besides a well-formed HTTP request.

A WebSocket handshake, a body that never completes, malformed chunked framing, a 100 KiB path, a client that
resets while a second request is pipelined behind its first, and file descriptors across disconnects. Each
test runs once per server (``server`` is parametrized); what a server does by itself, before scorekit sees
anything, is recorded in docs/architecture.md ("What each server does at the edge").
"""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import socket
import time
from collections.abc import Iterator

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.routing import ECHO_LIMIT
from scorekit.settings import EngineConfig, Settings
from tests.hardening.conftest import docs, error_of, json_head, reset
from tests.live import SERVERS, Live, read_response, serve, settled_items, wait_for

# Small batches, so that a few hundred documents run as many batches (a request is "running" for a while).
SMALL_BATCHES = EngineConfig(max_batch_size=16, max_batch_tokens=4096)
# A complete, valid JSON body: a server or layer that wrongly called a cut-off stream complete would score it.
VALID = json.dumps({"queries": "q", "documents": "d"}).encode()


@pytest.fixture(scope="module", params=SERVERS)
def edge(request: pytest.FixtureRequest) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(engine=SMALL_BATCHES))
    with serve(app, request.param) as live:
        yield app, live


def answer_or_close(sock: socket.socket) -> tuple[int, dict[str, str], bytes] | None:
    """The response, or None when the server closed without one."""
    try:
        return read_response(sock)
    except (ConnectionError, TimeoutError):
        return None


# -- WebSocket ---------------------------------------------------------------------------------------------


def websocket_handshake(path: str) -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize("path", ["/score", "/nope", "/"])
def test_websocket_handshake_is_refused_without_a_traceback(
    edge: tuple[ScorekitApp, Live], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, live = edge
    with caplog.at_level(logging.WARNING), live.connect(timeout=10) as sock:
        sock.sendall(websocket_handshake(path))
        answer = answer_or_close(sock)
    assert answer is not None and answer[0] == 403, answer
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    assert live.json("POST", "/score", {"queries": "q", "documents": "d"})[0] == 200


# -- bodies that never complete ------------------------------------------------------------------------------


def cut_off(framing: str) -> bytes:
    """A request whose body stops early; the bytes sent are VALID in full, so only completion is missing."""
    if framing == "content-length":
        head = json_head("/score", VALID).replace(
            b"Content-Length: %d" % len(VALID), b"Content-Length: %d" % (2 * len(VALID))
        )
        return head + VALID
    head = json_head("/score", b"").replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    return head + b"%x\r\n%s\r\n" % (len(VALID), VALID)  # no terminating zero-size chunk


@pytest.mark.parametrize("ending", ["shutdown", "close", "reset"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_that_never_completes_never_reaches_the_endpoint(
    edge: tuple[ScorekitApp, Live], framing: str, ending: str
) -> None:
    app, live = edge
    before = settled_items(app)
    sock = live.connect(timeout=10)
    sock.sendall(cut_off(framing))
    time.sleep(0.1)  # the bytes are read as their own message before the end of the stream
    answer = None
    if ending == "shutdown":  # the client stops sending but still reads
        sock.shutdown(socket.SHUT_WR)
        answer = answer_or_close(sock)
        sock.close()
    elif ending == "close":
        sock.close()
    else:
        reset(sock)
    assert wait_for(lambda: app.load.total == 0, timeout=10)
    assert settled_items(app) == before, "a cut-off body reached the model"
    if answer is not None:
        status, _, body = answer
        assert status == 400, answer
        if body:  # hypercorn answers by itself with an empty 400; granian lets scorekit answer
            assert error_of(status, body, 400)["param"] == "body"
    assert live.json("POST", "/score", {"queries": "q", "documents": "d"})[0] == 200


MALFORMED = {
    "bad hex": b"zz\r\n",
    "negative size": b"-5\r\nhello\r\n0\r\n\r\n",
    "overflowing size": b"f" * 40 + b"\r\nhello\r\n0\r\n\r\n",
    "missing CRLF": b"5\r\nhelloXX0\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_chunked_framing_is_never_a_500(edge: tuple[ScorekitApp, Live], case: str) -> None:
    """uvicorn and hypercorn answer 400 themselves (or close); granian reports a disconnect and scorekit answers."""
    app, live = edge
    before = settled_items(app)
    head = json_head("/score", b"").replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    with live.connect(timeout=10) as sock:
        sock.sendall(head + b"%x\r\n%s\r\n" % (len(VALID), VALID) + MALFORMED[case])
        sock.shutdown(socket.SHUT_WR)  # so that a server waiting for more of a huge chunk sees the end
        answer = answer_or_close(sock)
    assert answer is None or answer[0] == 400, answer
    if answer is not None and answer[2].startswith(b"{"):
        assert error_of(answer[0], answer[2], 400)["param"] == "body"
    assert settled_items(app) == before
    assert live.json("POST", "/score", {"queries": "q", "documents": "d"})[0] == 200


# What each server does with a chunk size of 18 hex digits (2**72 bytes, more than 64 bits hold), first while the
# client keeps its connection open, then once it shuts its write side: "none" is no answer, "closed" a close
# without one, "400" a 400 (scorekit's JSON error, or hypercorn's own empty one: after a FIN the two race). h11
# (uvicorn's and hypercorn's parser) takes up to 20 hex digits and waits for the data; granian's refuses a size
# over 16 digits as malformed framing at once. docs/architecture.md has the row, and the server options tried.
HUGE_CHUNK = {
    "uvicorn": ("none", "closed"),
    "hypercorn": ("none", "400"),
    "granian": ("400", "400"),
}


def test_an_18_digit_chunk_size(edge: tuple[ScorekitApp, Live]) -> None:
    app, live = edge
    before = settled_items(app)
    head = json_head("/score", b"").replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    seen = []
    with live.connect(timeout=10) as sock:
        sock.sendall(head + b"%x\r\n%s\r\n" % (len(VALID), VALID) + b"f" * 18 + b"\r\nhello\r\n")
        readable, _, _ = select.select([sock], [], [], 1.0)  # an answer comes at once, or not at all
        if readable:
            answer = answer_or_close(sock)
            seen.append("closed" if answer is None else str(answer[0]))
        else:
            seen.append("none")
            sock.shutdown(socket.SHUT_WR)
            answer = answer_or_close(sock)
        seen.append("closed" if answer is None else str(answer[0]))
    if answer is not None and answer[2]:  # hypercorn's own 400 (empty) and scorekit's race after the FIN
        assert error_of(answer[0], answer[2], 400)["param"] == "body"
    assert tuple(seen) == HUGE_CHUNK[live.server], f"{live.server} changed: update docs/architecture.md"
    assert settled_items(app) == before
    assert live.json("POST", "/score", {"queries": "q", "documents": "d"})[0] == 200


# -- what an error message echoes -----------------------------------------------------------------------------


def test_a_long_path_is_not_echoed_whole(edge: tuple[ScorekitApp, Live]) -> None:
    _, live = edge
    path = "/" + "a" * 5000
    status, body = live.json("GET", path)
    message = error_of(status, json.dumps(body).encode(), 404)["message"]
    assert len(message) < ECHO_LIMIT + 40 and "/" + "a" * (ECHO_LIMIT - 1) + "…" in message
    # 100 KiB: hypercorn (431) and granian (414) refuse it themselves; under uvicorn the 404 is capped.
    with live.connect(timeout=10) as sock:
        sock.sendall(b"GET /" + b"b" * 100 * 1024 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = answer_or_close(sock)
    assert answer is None or (answer[0] != 500 and len(answer[2]) < 1024), answer


# -- pipelining and descriptors ------------------------------------------------------------------------------------


def test_a_reset_behind_a_pipelined_request(edge: tuple[ScorekitApp, Live]) -> None:
    """Documents the servers: uvicorn notices the reset and cancels the running request; hypercorn and granian
    do not read the connection while a request runs, so its work runs to the end (a plain ASGI app alike)."""
    app, live = edge
    engine = app.engine
    assert engine is not None
    body = json.dumps({"query": "topic", "documents": docs(400)}).encode()
    items = 401  # a bi-encoder encodes the query and each document
    before = settled_items(app)
    sock = live.connect(timeout=10)
    head = json_head("/rerank", body).replace(b"Connection: close\r\n", b"")
    sock.sendall(head + body + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert wait_for(lambda: engine.snapshot().worker.items >= before + 2 * SMALL_BATCHES.max_batch_size, timeout=30)
    reset(sock)
    assert wait_for(lambda: app.load.routed == 0, timeout=60)
    ran = settled_items(app) - before
    if live.server == "uvicorn":
        assert ran < items, "uvicorn did not report the reset"
    else:
        assert ran == items, f"{live.server} now notices a pipelined reset: update docs/architecture.md"


def open_fds() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, gone by now
            continue
    return found


def disconnect_phases(app: ScorekitApp, live: Live) -> None:
    """The client leaves during the headers, during the body, while queued and while running."""
    engine = app.engine
    assert engine is not None
    small = json.dumps({"query": "q", "documents": docs(2)}).encode()
    large = json.dumps({"query": "q", "documents": docs(400)}).encode()
    with live.connect() as sock:
        sock.sendall(json_head("/rerank", small)[:30])
        time.sleep(0.05)
    with live.connect() as sock:
        sock.sendall(json_head("/rerank", small) + small[:10])
        time.sleep(0.05)
    start = settled_items(app)  # the first round's last batch may still be landing: it must not count as this one's
    running = live.connect()
    running.sendall(json_head("/rerank", large) + large)
    assert wait_for(lambda: engine.snapshot().worker.items > start, timeout=30)
    queued = live.connect()
    queued.sendall(json_head("/rerank", small) + small)
    time.sleep(0.05)
    reset(queued)
    running.close()
    assert wait_for(lambda: app.load.total == 0, timeout=30)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_disconnects_leave_no_descriptors_behind(edge: tuple[ScorekitApp, Live]) -> None:
    """The first round may open what a server creates once (pools, selectors); the second must open nothing."""
    app, live = edge
    disconnect_phases(app, live)
    gc.collect()
    after_first = open_fds()
    disconnect_phases(app, live)

    def settled() -> bool:
        gc.collect()
        return len(open_fds()) <= len(after_first)

    # A server closes its side of a connection when it next reads it: poll, with a wide bound.
    assert wait_for(settled, timeout=10, interval=0.1), {
        fd: target for fd, target in open_fds().items() if after_first.get(fd) != target
    }
