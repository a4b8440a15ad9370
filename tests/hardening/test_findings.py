"""The smaller findings of issue 28, each pinned over real sockets: what /metrics counts for an answer sent after
the app returned, and /invocations' and /openapi.json's agreement with the rest of the API.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from scorekit.api.routes import ROUTES
from scorekit.app import ScorekitApp, create_app
from scorekit.routing import Route
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.hardening.conftest import Sample, docs, error_of, json_head, reset, scrape
from tests.live import Live, read_response, serve, settled_items, wait_for
from tests.tiny_models import build_causal_lm

ROOT = Path(__file__).resolve().parents[2]

# Small batches, so that a few hundred documents run as many batches (a request is "running" for a while).
SMALL_BATCHES = EngineConfig(max_batch_size=16, max_batch_tokens=4096)
VALID = json.dumps({"queries": "q", "documents": "d"}).encode()


@pytest.fixture(scope="module")
def granian() -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(engine=SMALL_BATCHES))
    with serve(app, "granian") as live:
        yield app, live


def requests_counted(before: dict[Sample, float], after: dict[Sample, float], route: str, status: int) -> float:
    key = ("scorekit_requests_total", tuple(sorted({"route": route, "status": str(status)}.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


# -- /metrics counts the status sent, also when it is sent after the app returned -----------------------------


def test_metrics_count_the_400_sent_to_a_malformed_body_under_granian(granian: tuple[ScorekitApp, Live]) -> None:
    """granian reports malformed chunked framing as a disconnect and keeps the connection: the lifecycle answers
    400 after the app has returned, and /metrics counts that 400, not a 499."""
    app, live = granian
    before = scrape(live)
    head = json_head("/score", b"").replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    with live.connect(timeout=10) as sock:
        sock.sendall(head + b"%x\r\n%s\r\n" % (len(VALID), VALID) + b"zz\r\n")
        sock.shutdown(socket.SHUT_WR)
        status, _, body = read_response(sock)
    assert error_of(status, body, 400)["param"] == "body"
    assert wait_for(lambda: app.load.total == 0, timeout=10)
    after = scrape(live)
    assert requests_counted(before, after, "/score", 400) == 1
    assert requests_counted(before, after, "/score", 499) == 0


def test_metrics_count_499_for_a_client_gone_with_nothing_sent(granian: tuple[ScorekitApp, Live]) -> None:
    """A client that resets while its request runs is sent nothing: that stays a 499."""
    app, live = granian
    engine = app.engine
    assert engine is not None
    body = json.dumps({"query": "topic", "documents": docs(400)}).encode()
    before_items = settled_items(app)
    before = scrape(live)
    sock = live.connect(timeout=10)
    sock.sendall(json_head("/rerank", body) + body)
    assert wait_for(
        lambda: engine.snapshot().worker.items >= before_items + 2 * SMALL_BATCHES.max_batch_size, timeout=30
    )
    reset(sock)
    assert wait_for(lambda: app.load.total == 0, timeout=60)
    after = scrape(live)
    assert requests_counted(before, after, "/rerank", 499) == 1
    assert requests_counted(before, after, "/rerank", 400) == 0


# -- /invocations answers as the route its body is for ----------------------------------------------------------


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The embedded MiniLM (scores and reranks, no generative scoring) beside a tiny causal LM (the reverse)."""
    lm = build_causal_lm(tmp_path_factory.mktemp("tiny-lm"))
    settings = Settings(models=(ModelSpec(name="minilm"), ModelSpec(str(lm), name="tiny-lm")))
    with serve(create_app(settings)) as live:
        yield live


DEEP = 100_000
GENERATIVE = {"query": "q", "items": ["i"], "label_token_ids": [1]}
RERANK = {"query": "q", "documents": ["d"]}
SCORE = {"queries": "q", "documents": ["d"]}
# (what is sent, its content type, the path whose answer /invocations must give)
AS_ITS_PATH = {
    "invalid JSON": (b"{not json", "application/json", "/score"),
    "an empty body": (b"", "application/json", "/score"),
    "nested too deeply": (
        b'{"queries": "q", "documents": "d", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        None,
        "/score",
    ),
    "not JSON's media type": (json.dumps(SCORE).encode(), "text/plain", "/score"),
    "generative scoring on a bi-encoder": (
        json.dumps({**GENERATIVE, "model": "minilm"}).encode(),
        None,
        "/generative_scoring",
    ),
    "rerank on a causal LM": (json.dumps({**RERANK, "model": "tiny-lm"}).encode(), None, "/rerank"),
    "score on a causal LM": (json.dumps({**SCORE, "model": "tiny-lm"}).encode(), None, "/score"),
    "a validation error": (json.dumps({"query": "q", "documents": []}).encode(), None, "/rerank"),
    "an unknown model": (json.dumps({**GENERATIVE, "model": "nope"}).encode(), None, "/generative_scoring"),
}


@pytest.mark.parametrize("case", sorted(AS_ITS_PATH))
def test_invocations_errors_are_those_of_the_path_the_body_is_for(two_models: Live, case: str) -> None:
    """Status and body alike: the API an error names is the one the body was recognised as, never
    "/invocations", and a body that is not JSON is refused in /score's words."""
    body, content_type, path = AS_ITS_PATH[case]
    headers = {"content-type": content_type or "application/json"}
    via_invocations = two_models.request("POST", "/invocations", body, headers=headers)
    direct = two_models.request("POST", path, body, headers=headers)
    status, _, raw = via_invocations
    assert status >= 400 and "/invocations" not in raw.decode(), via_invocations
    error_of(status, raw, status)
    assert (status, json.loads(raw)) == (direct[0], json.loads(direct[2]))


def test_invocations_names_the_api_the_model_lacks(two_models: Live) -> None:
    status, answer = two_models.json("POST", "/invocations", {**GENERATIVE, "model": "minilm"})
    assert (status, answer["error"]["message"]) == (404, "The model does not support the Generative Scoring API.")


# -- /openapi.json describes every route of the table ----------------------------------------------------------


def test_every_route_of_the_table_is_in_openapi(two_models: Live) -> None:
    status, document = two_models.json("GET", "/openapi.json")
    assert status == 200
    methods: dict[str, set[str]] = {entry.path: set() for entry in ROUTES}
    for entry in ROUTES:
        target = (
            entry
            if isinstance(entry, Route)
            else next(r for r in ROUTES if isinstance(r, Route) and r.path == entry.to)
        )
        methods[entry.path].add(target.method.lower())
    described = {path: set(operations) for path, operations in document["paths"].items()}
    assert described == methods


def test_the_api_docs_list_every_path_of_openapi() -> None:
    """docs/api.md's /openapi.json example prints the document's paths: it must be the table's."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## GET /openapi.json", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed = [line for line in section.strip().splitlines()[1:]]
    assert listed == sorted({entry.path for entry in ROUTES})
