"""The server's rules that no other test pinned (issue 28's audit), each over real sockets: docs/invariants.md,
"The server's rules", states them (S1-S10) and mutants/catalog.py's S mutants break them one at a time.

Keys and CORS run on one server configured as an operator would, through the command line's parser (a key
file with indented comments, origins, no --allow-credentials); the drain rules on a server whose embedder's
middleware streams an answer; the limits on one server with small limits; the head deadline on a real
``scorekit serve`` process, the only place it exists. Where a rule is about counting, /metrics is checked too
(polled: a request is counted just after its answer leaves).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.middleware import Middleware

from scorekit.api.routes import ROUTES
from scorekit.app import ScorekitApp, create_app
from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.cli import parse
from scorekit.routing import Route
from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.hardening.conftest import Sample, error_of, request_head, scrape
from tests.hardening.process import log_lines, scorekit_serve
from tests.hardening.test_connections import _closed_by_server
from tests.hardening.test_metrics import _value
from tests.live import Live, chunked, http_head, read_response, serve, wait_for

# As tests/e2e/test_api_keys.py's (not imported: mypy reads that module's cohere calls as errors).
KEYS = ("k1-8d0c4c6e", "k2-51b7f2aa")
ORIGIN = "https://app.example"
RERANK: dict[str, Any] = {"query": "capital of France", "documents": ["Paris is the capital of France.", "Bananas."]}
OPEN = ("/health", "/healthz", "/readyz", "/ping", "/metrics", "/load")  # the probes: open with a key set
UNAUTHORIZED = b'{"error":{"message":"Unauthorized","type":"UnauthorizedError","param":null,"code":401}}'


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _wait_counted(live: Live, before: dict[Sample, float], expected: dict[tuple[str, str], float]) -> None:
    """Wait until ``scorekit_requests_total`` has moved by ``expected`` ((route, status) -> count) since ``before``."""

    def moved() -> dict[tuple[str, str], float]:
        now = scrape(live)
        return {
            (route, status): _value(now, "scorekit_requests_total", route=route, status=status)
            - _value(before, "scorekit_requests_total", route=route, status=status)
            for route, status in expected
        }

    wait_for(lambda: moved() == expected, timeout=10)
    assert moved() == expected


# -- S1-S4: API keys and CORS, as `scorekit serve --api-key-file F --allowed-origins O` sets them ----------------

RETIRED = "k0-retired-3a9e"  # behind an indented "#": a comment, never a key
KEY_FILE = f"# the team's keys\n    # {RETIRED}\n{KEYS[0]}\n\t# also retired: k9\n\n  {KEYS[1]}\n"
KEY = KEYS[0]
NEAR_MISSES = {
    "a prefix": KEY[:-1],
    "its first half": KEY[: len(KEY) // 2],
    "a substring": KEY[1:-1],
    "a suffix": KEY[1:],
    "a character added after it": KEY + "0",
    "a character added before it": "k" + KEY,
    "its last character changed": KEY[:-1] + chr(ord(KEY[-1]) ^ 1),
}
# One of each kind: (method, path, body, the route label /metrics counts it under).
ROUTE_KINDS: tuple[tuple[str, str, dict[str, Any] | None, str], ...] = (
    ("POST", "/rerank", RERANK, "/rerank"),  # a scoring route
    ("POST", "/v2/rerank", RERANK, "/rerank"),  # an alias, counted under its route
    ("POST", "/invocations", RERANK, "/invocations"),  # SageMaker's one route
    ("GET", "/v1/models", None, "/v1/models"),  # a GET service route
    ("GET", "/openapi.json", None, "/openapi.json"),
    ("GET", "/version", None, "/version"),
    ("POST", "/nowhere", RERANK, "unmatched"),  # no route at all
    ("GET", "/nowhere", None, "unmatched"),
)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ScorekitApp, Live]]:
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(KEY_FILE)
    with pytest.MonkeyPatch.context() as env:  # the flags alone: no SCOREKIT_* variable of the machine's
        for name in [name for name in os.environ if name.startswith("SCOREKIT_")]:
            env.delenv(name)
        settings = parse(["serve", "--api-key-file", str(keys), "--allowed-origins", ORIGIN]).settings
    app = create_app(settings)
    with serve(app) as live:
        yield app, live


def _items(app: ScorekitApp) -> int:
    assert app.engine is not None
    return app.engine.snapshot().worker.items


def test_a_near_miss_of_a_key_is_refused_on_every_route_kind(keyed: tuple[ScorekitApp, Live]) -> None:
    """A prefix, a substring, the key with a character added: each is refused like no key at all, on every kind
    of route, before any model work, and counted under its route as a 401."""
    app, live = keyed
    for method, path, body, _ in ROUTE_KINDS:  # the right key passes on each
        status, _, raw = live.request(method, path, body, headers=_bearer(KEY))
        assert status == (404 if path == "/nowhere" else 200), (path, raw[:300])
    items, before = _items(app), scrape(live)
    expected: dict[tuple[str, str], float] = {}
    for miss, token in NEAR_MISSES.items():
        for method, path, body, label in ROUTE_KINDS:
            status, headers, raw = live.request(method, path, body, headers=_bearer(token))
            assert (status, raw) == (401, UNAUTHORIZED), (miss, method, path, status, raw[:300])
            assert headers["www-authenticate"] == "Bearer"
            expected[label, "401"] = expected.get((label, "401"), 0) + 1
    _wait_counted(live, before, expected)
    assert _items(app) == items  # not one item ran for a refused request
    assert live.wait_load(0) == 0


def test_every_get_route_but_the_probes_needs_the_key(keyed: tuple[ScorekitApp, Live]) -> None:
    """Every GET route of the table (a new one included) but the probes (/health, /healthz, /readyz, /ping, /metrics
    and /load) answers 401 without a key and 200 with one; the probes answer without."""
    _, live = keyed
    guarded = sorted({r.path for r in ROUTES if isinstance(r, Route) and r.method == "GET"} - set(OPEN))
    assert {"/v1/models", "/openapi.json", "/version"} <= set(guarded), guarded
    for path in guarded:
        status, headers, raw = live.request("GET", path)
        assert (status, raw) == (401, UNAUTHORIZED), (path, status, raw[:300])
        assert headers["www-authenticate"] == "Bearer"
        assert live.request("GET", path, headers=_bearer(KEYS[1]))[0] == 200, path
    for path in OPEN:
        assert live.request("GET", path)[0] == 200, path


def test_an_indented_hash_line_in_the_key_file_is_a_comment(keyed: tuple[ScorekitApp, Live]) -> None:
    """``    # k0-...`` in --api-key-file is a comment however it is indented: the text after the ``#`` is no key."""
    app, live = keyed
    assert app.settings.api_keys == KEYS
    for token in (RETIRED, f"# {RETIRED}", "# also retired: k9"):
        status, _, raw = live.request("POST", "/rerank", RERANK, headers=_bearer(token))
        assert (status, raw) == (401, UNAUTHORIZED), token
    assert live.request("POST", "/rerank", RERANK, headers=_bearer(KEYS[1]))[0] == 200  # an indented key is one


def test_without_allow_credentials_no_answer_allows_credentials(keyed: tuple[ScorekitApp, Live]) -> None:
    """--allowed-origins without --allow-credentials: no answer carries access-control-allow-credentials, be it a
    preflight (allowed or refused), a scored answer, a 401, a 404 or a probe; CORS did dress each one."""
    app, live = keyed
    assert app.settings.allow_credentials is False
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    answers = {
        "a preflight": (200, live.request("OPTIONS", "/rerank", headers=preflight)),
        "a refused preflight": (
            400,
            live.request("OPTIONS", "/rerank", headers={**preflight, "Origin": "https://elsewhere.example"}),
        ),
        "a scored answer": (200, live.request("POST", "/rerank", RERANK, headers={"Origin": ORIGIN, **_bearer(KEY)})),
        "a 401": (401, live.request("POST", "/rerank", RERANK, headers={"Origin": ORIGIN})),
        "a 404": (404, live.request("GET", "/nowhere", headers={"Origin": ORIGIN, **_bearer(KEY)})),
        "a probe": (200, live.request("GET", "/health", headers={"Origin": ORIGIN})),
    }
    for what, (expected, (status, headers, _)) in answers.items():
        assert status == expected, (what, status)
        assert "access-control-allow-credentials" not in headers, (what, headers)
        if what != "a refused preflight":
            assert headers["access-control-allow-origin"] == ORIGIN, (what, headers)


# -- S5-S6: the drain -----------------------------------------------------------------------------------------

STREAM, HOLD = "/_rules/stream", "/_rules/hold"


class Streaming:
    """An embedder's middleware (under the in-flight tracker, as ``create_app(middleware=...)`` puts it): on
    STREAM it sends an answer's head and a first chunk at once, then nothing more (a long poll, server-sent
    events); on HOLD it answers nothing. Both wait until cancelled. ``held`` is set once HOLD is in flight."""

    def __init__(self, app: ASGIApp, *, held: threading.Event) -> None:
        self.app = app
        self.held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == STREAM:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await anyio.sleep_forever()
        elif scope["type"] == "http" and scope["path"] == HOLD:
            self.held.set()
            await anyio.sleep_forever()
        else:
            await self.app(scope, receive, send)


class Tap:
    """Between the real server and the app: what the app sent the server for each path, what came out of the app
    raised, and the server's event loop (to run the drain's cut on, as the server process does)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.sent: dict[str, list[str]] = {}
        self.raised: list[str] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.loop = asyncio.get_running_loop()
        sent = self.sent.setdefault(scope["path"], [])

        async def tapped(message: Message) -> None:
            sent.append(message["type"])
            await send(message)

        try:
            await self.app(scope, receive, tapped)
        except BaseException as exc:
            self.raised.append(f"{scope['path']}: {exc!r}")
            raise


@pytest.fixture(scope="module")
def draining() -> Iterator[tuple[ScorekitApp, Tap, threading.Event, Live]]:
    held = threading.Event()
    app = create_app(Settings(), middleware=[Middleware(Streaming, held=held)])
    tap = Tap(app)
    with serve(tap) as live:
        yield app, tap, held, live


def test_while_draining_a_request_no_route_takes_gets_its_404_or_405(
    draining: tuple[ScorekitApp, Tap, threading.Event, Live],
) -> None:
    """The drain refuses new scoring work with 503; a path no route has is still a 404 and a method its path
    does not take still a 405 (with Allow), counted as such under ``unmatched``, not as 503s."""
    app, _, _, live = draining
    before = scrape(live)
    app.drain.begin()
    try:
        for method in ("GET", "POST"):
            status, _, raw = live.request(method, "/nowhere", {} if method == "POST" else None)
            assert "/nowhere" in error_of(status, raw, 404)["message"]
        for method, path, allow in (("GET", "/rerank", "POST"), ("DELETE", "/v1/embeddings", "POST")):
            status, headers, raw = live.request(method, path)
            error_of(status, raw, 405)
            assert headers["allow"] == allow
        status, _, raw = live.request("POST", "/rerank", RERANK)  # the gate is on: scoring work is refused
        assert "shutting down" in error_of(status, raw, 503)["message"]
        _wait_counted(live, before, {("unmatched", "404"): 2, ("unmatched", "405"): 2, ("unmatched", "503"): 0})
        _wait_counted(live, before, {("/rerank", "503"): 1})
    finally:
        app.drain.draining = False


def test_an_answer_started_before_the_drain_deadline_gets_no_503_on_top(
    draining: tuple[ScorekitApp, Tap, threading.Event, Live],
) -> None:
    """At the drain's deadline every request still in flight is cut: one not answered yet gets the JSON 503,
    but one whose answer had started (its head and a chunk are out) just ends: the server is sent no second
    answer and nothing is raised at it."""
    app, tap, held, live = draining
    holder: dict[str, Any] = {}

    def hold() -> None:
        holder["answer"] = live.request("GET", HOLD, timeout=30)

    with live.connect(timeout=30) as streaming:
        streaming.sendall(request_head("GET", STREAM, {}))
        seen = b""
        while b"first" not in seen:
            got = streaming.recv(65536)
            assert got, seen
            seen += got
        assert seen.startswith(b"HTTP/1.1 200")
        waiting = threading.Thread(target=hold)
        waiting.start()
        assert held.wait(30)
        assert tap.loop is not None
        app.drain.begin()
        try:  # what the server process does at the deadline (serving._DrainingServer._cut)
            cut = asyncio.run_coroutine_threadsafe(app.drain.cut(5.0), tap.loop).result(60)
        finally:
            app.drain.draining = False
        rest = b""
        try:
            while got := streaming.recv(65536):
                rest += got
        except ConnectionError:
            pass
        waiting.join(30)
    assert cut == 2
    assert b"HTTP/1.1" not in rest and b"503" not in rest, rest
    assert tap.sent[STREAM] == ["http.response.start", "http.response.body"]
    status, _, raw = holder["answer"]
    assert "shutting down" in error_of(status, raw, 503)["message"]
    assert tap.sent[HOLD] == ["http.response.start", "http.response.body"]
    assert tap.raised == []


# -- S7-S9: every limit at its boundary ---------------------------------------------------------------------------

QUEUE, ITEMS, BODY = 8, 12, 512  # --max-queued-items, --max-items-per-request, --max-body-bytes
EMBEDDINGS = "/v1/embeddings"


@pytest.fixture(scope="module")
def limited() -> Iterator[tuple[ScorekitApp, Live]]:
    settings = Settings.for_model(
        max_body_bytes=BODY, max_items_per_request=ITEMS, engine=EngineConfig(max_queued_items=QUEUE)
    )
    app = create_app(settings)
    with serve(app) as live:
        yield app, live


def test_exactly_max_queued_items_inputs_are_accepted_and_one_more_is_refused(
    limited: tuple[ScorekitApp, Live],
) -> None:
    """QUEUE distinct inputs on an idle server are embedded; QUEUE + 1 can never be queued: a 400 (not a 503
    that says retry), counted as a rejected too_many_inputs."""
    _, live = limited
    before = scrape(live)
    status, body = live.json("POST", EMBEDDINGS, {"input": [f"text {i}" for i in range(QUEUE)]})
    assert status == 200 and len(body["data"]) == QUEUE, body
    status, headers, raw = live.request("POST", EMBEDDINGS, {"input": [f"text {i}" for i in range(QUEUE + 1)]})
    error = error_of(status, raw, 400)
    assert f"needs {QUEUE + 1} model inputs" in error["message"] and f"queues at most {QUEUE}" in error["message"]
    assert "retry-after" not in headers
    _wait_counted(live, before, {(EMBEDDINGS, "200"): 1, (EMBEDDINGS, "400"): 1, (EMBEDDINGS, "503"): 0})
    rejected = "scorekit_requests_rejected_total"
    labels = {"model": DEFAULT_MODEL_NAME, "reason": "too_many_inputs"}
    assert _value(scrape(live), rejected, **labels) - _value(before, rejected, **labels) == 1


def test_exactly_max_items_per_request_inputs_are_accepted_and_one_more_is_refused(
    limited: tuple[ScorekitApp, Live],
) -> None:
    """ITEMS inputs are embedded, ITEMS + 1 are a 400 naming ``input``. The inputs repeat one text, which runs
    once, so the queue's smaller limit is not what is checked here."""
    _, live = limited
    before = scrape(live)
    status, body = live.json("POST", EMBEDDINGS, {"input": ["the same text"] * ITEMS})
    assert status == 200 and len(body["data"]) == ITEMS, body
    status, _, raw = live.request("POST", EMBEDDINGS, {"input": ["the same text"] * (ITEMS + 1)})
    error = error_of(status, raw, 400)
    assert error["param"] == "input" and f"at most {ITEMS}" in error["message"], error
    _wait_counted(live, before, {(EMBEDDINGS, "200"): 1, (EMBEDDINGS, "400"): 1})


def _body_of(size: int) -> bytes:
    """A valid /v1/embeddings body of exactly ``size`` bytes: one short input, padded with JSON whitespace."""
    head = b'{"input": ["a"]'
    return head + b" " * (size - len(head) - 1) + b"}"


def test_a_body_of_exactly_max_body_bytes_is_accepted_and_one_byte_more_is_refused(
    limited: tuple[ScorekitApp, Live],
) -> None:
    """BODY bytes are read and scored, declared (Content-Length) or streamed (chunked); BODY + 1 is a 413 with
    ``param: "body"`` either way."""
    _, live = limited
    before = scrape(live)
    chunked_head = http_head("POST", EMBEDDINGS, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    for size, expected in ((BODY, 200), (BODY + 1, 413)):
        body = _body_of(size)
        assert len(body) == size
        declared = live.request("POST", EMBEDDINGS, body)
        pieces = [body[:100], body[100:300], body[300:]]
        streamed = live.raw([chunked_head + b"".join(chunked(pieces))])  # one write: the server reads it all
        for how, (status, _, raw) in (("declared", declared), ("streamed", streamed)):
            if expected == 200:
                assert status == 200, (how, size, raw[:300])
            else:
                error = error_of(status, raw, 413)
                assert error["param"] == "body" and str(BODY) in error["message"], (how, error)
    _wait_counted(live, before, {(EMBEDDINGS, "200"): 2, (EMBEDDINGS, "413"): 2})


# -- S10: the head deadline on a kept-alive connection -----------------------------------------------------------

HEAD_S = 2  # --header-timeout


def test_a_kept_alive_connections_next_head_gets_the_header_deadline(tmp_path: Path) -> None:
    """A client that sends one whole request, keeps the connection and then dribbles the next request's head is
    closed by the same --header-timeout as a first head (uvicorn's keep-alive timer stops at the first byte)."""
    with scorekit_serve(tmp_path, "--header-timeout", str(HEAD_S)) as (proc, live, log):
        with live.connect(timeout=30) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, headers, _ = read_response(sock)
            assert status == 200 and headers.get("connection") != "close", headers
            started = time.monotonic()  # before the head's first byte, which arms its deadline
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            closed = False
            while not closed and time.monotonic() - started < 10 * HEAD_S:  # a byte every 0.2 s, for long enough
                time.sleep(0.2)
                try:
                    sock.sendall(b"a")
                except OSError:
                    closed = True
                    break
                closed = _closed_by_server(sock)
            assert closed, f"a dribbled second head was still open after {10 * HEAD_S} s"
            assert time.monotonic() - started >= HEAD_S  # not before its deadline
        assert live.request("GET", "/health", timeout=30)[0] == 200
        proc.terminate()
        assert proc.wait(60) == 0
    assert log_lines(log, "no request head in time"), log.read_text()[-3000:]
