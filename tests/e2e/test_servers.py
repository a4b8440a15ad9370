"""The same API under every ASGI server: uvicorn, hypercorn and granian (``served_minilm`` is parametrized).

The servers differ in how they cut a body into messages, how they report a disconnect and what their
``receive`` does after the response (see the lifecycle notes, §2); none of it may show through the API.
"""

from __future__ import annotations

import itertools
import json
import socket
import time

import pytest
import torch
from sentence_transformers import SentenceTransformer

from scorekit.app import ScorekitApp
from scorekit.models import default_model_path
from tests.e2e.texts import DOCS, QUERY, many_docs
from tests.live import Live, chunked, close_answers, http_head, read_response, settled_stats, wait_for

# Batches that may still run between a client's close and the server noticing it: a few on an idle machine,
# more on a loaded one. Well under the 2000 documents' 125 batches, so "it stopped early" still holds.
NOTICE_BATCHES = 10

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def expected() -> list[float]:
    """sentence-transformers' cosine similarity of QUERY with each of DOCS: the reference scores."""
    model = SentenceTransformer(default_model_path(), device="cpu")
    query = torch.tensor(model.encode([QUERY] * len(DOCS)))
    docs = torch.tensor(model.encode(DOCS))
    scores: list[float] = torch.nn.functional.cosine_similarity(query, docs).tolist()
    return scores


def test_score_matches_sentence_transformers(served_minilm: Live, expected: list[float]) -> None:
    status, body = served_minilm.json("POST", "/score", {"queries": QUERY, "documents": DOCS})
    assert status == 200, body
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert body["object"] == "list" and body["id"].startswith("score-")


def test_rerank_matches_sentence_transformers(served_minilm: Live, expected: list[float]) -> None:
    status, body = served_minilm.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    assert status == 200, body
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in body["results"]] == order
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([expected[i] for i in order], abs=1e-5)
    assert [r["document"] for r in body["results"]] == [{"text": DOCS[i]} for i in order]


@pytest.mark.parametrize(("alias", "canonical"), [("/v1/score", "/score"), ("/v1/rerank", "/rerank")])
def test_aliases_answer_as_the_canonical_route_with_a_deprecation_header(
    served_minilm: Live, alias: str, canonical: str
) -> None:
    payload = {"queries": QUERY, "documents": DOCS} if canonical == "/score" else {"query": QUERY, "documents": DOCS}
    s1, h1, raw1 = served_minilm.request("POST", canonical, payload)
    s2, h2, raw2 = served_minilm.request("POST", alias, payload)
    assert s1 == s2 == 200
    assert "deprecation" not in h1
    assert h2["deprecation"] == "true" and canonical in h2["link"]
    one, two = json.loads(raw1), json.loads(raw2)
    key = "data" if canonical == "/score" else "results"
    assert one[key] == two[key]


def test_unknown_path_and_wrong_method_are_json_errors(served_minilm: Live) -> None:
    status, headers, raw = served_minilm.request("GET", "/nope")
    assert status == 404 and headers["content-type"].startswith("application/json")
    assert json.loads(raw)["error"]["code"] == 404
    status, headers, raw = served_minilm.request("GET", "/score")
    error = json.loads(raw)["error"]
    assert status == 405 and error["code"] == 405 and set(error) == {"message", "type", "param", "code"}
    assert headers["allow"] == "POST"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_sent_in_timed_pieces_arrives_whole(served_minilm: Live, expected: list[float], framing: str) -> None:
    body = json.dumps({"queries": QUERY, "documents": DOCS}).encode()
    cuts = [0, 7, 40, len(body) - 3, len(body)]  # cut inside keys, inside strings and before the last brace
    pieces = [body[a:b] for a, b in itertools.pairwise(cuts)]
    if framing == "chunked":
        head = http_head("POST", "/score", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        frames = chunked(pieces)
    else:
        head = http_head("POST", "/score", {"Content-Type": "application/json", "Content-Length": str(len(body))})
        frames = pieces
    status, _, raw = served_minilm.raw([head, *frames], pause=0.05)
    assert status == 200, raw
    assert [d["score"] for d in json.loads(raw)["data"]] == pytest.approx(expected, abs=1e-5)


def test_a_client_that_leaves_mid_body_is_not_load(served_minilm: Live) -> None:
    head = http_head("POST", "/rerank", {"Content-Type": "application/json", "Content-Length": "1000"})
    sock = served_minilm.connect()
    sock.sendall(head + b'{"query": "q", "documents": ["')
    assert wait_for(lambda: served_minilm.load() == 1, timeout=10), "the request never reached the app"
    sock.close()
    assert served_minilm.wait_load(0) == 0
    status, _ = served_minilm.json("POST", "/rerank", {"query": "q", "documents": ["d"]})
    assert status == 200


def test_a_disconnect_stops_a_2000_document_rerank(
    served_minilm: Live, served_minilm_app: ScorekitApp, capsys: pytest.CaptureFixture[str]
) -> None:
    live, app = served_minilm, served_minilm_app
    engine = app.engine
    assert engine is not None
    batch_size = app.settings.models[0].engine.max_batch_size
    # The server is shared across tests: a batch of an earlier test's cancelled request may still be landing.
    start = settled_stats(app)
    start_items, start_late = start.items, start.items_of_cancelled_jobs
    sock = live.send_json("/rerank", {"query": "topic 3", "documents": many_docs(2000)})
    assert wait_for(lambda: engine.snapshot().worker.items >= start_items + 3 * batch_size, timeout=30), (
        "the rerank never started"
    )
    assert live.load() == 1
    sock.close()
    closed_at, items_at_close = time.monotonic(), engine.snapshot().worker.items
    assert wait_for(lambda: live.load() == 0, timeout=10, interval=0.002), f"/load stayed at {live.load()}"
    noticed_s = time.monotonic() - closed_at
    end = settled_stats(app)  # a batch already on the model has landed
    ran_after = end.items - items_at_close
    with capsys.disabled():
        print(
            f"\n[{live.server}] disconnect: /load back to 0 {noticed_s * 1000:.0f} ms after the close; "
            f"{ran_after} items ran after it (batch size {batch_size}); {end.items - start_items}/2000 ran in all"
        )
    assert end.items_of_cancelled_jobs - start_late <= batch_size
    # Batches run while the server notices the close; how many depends on the machine's load (wide bound).
    assert ran_after <= NOTICE_BATCHES * batch_size, f"{ran_after} items ran after the close (batch {batch_size})"
    assert end.items - start_items < 2000
    assert engine.snapshot().queued_items == 0
    status, payload = live.json("POST", "/rerank", {"query": "q", "documents": ["d"]})
    assert status == 200 and payload["results"][0]["index"] == 0
    # The answer can reach the client just before the request leaves the lifecycle layer (granian, a busy CPU).
    assert live.wait_load(0) == 0


def test_keep_alive_requests_on_one_socket(served_minilm: Live) -> None:
    """Two requests on one connection: the second is a fresh scope, not a re-entry of the first."""
    body = json.dumps({"query": QUERY, "documents": DOCS}).encode()
    head = (
        f"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((served_minilm.host, served_minilm.port), timeout=60) as sock:
        first = second = None
        for _ in range(2):
            sock.sendall(head + body)
            status, _, raw = read_response(sock)
            assert status == 200
            first, second = second, json.loads(raw)["results"]
        assert close_answers(first, second)  # two requests, two batches: the same answer to 1e-5
    assert served_minilm.wait_load(0) == 0
