"""A long query costs what the model can keep of it, and its tokenizing stops within one bounded unit of work
when its client leaves, whatever the number of pairs it is joined into.

Counted by the engine, not by the clock (``EngineStats``, read through ``Engine.snapshot``): ``tokenize_work``
counts characters tokenized and tokens copied into model inputs, ``largest_step`` the most work between two
checkpoints, and ``work_after_abandon`` what a thread did between its client leaving and its stop.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.models.tokens import CHUNK_CHARS
from scorekit.settings import Settings
from tests.hardening.conftest import scrape
from tests.live import Live, http_head, serve, wait_for
from tests.tiny_models import MAX_POSITIONS

QUERY_WORDS = 1_600_000  # about 7.8 MB of text
DOCUMENTS = 40


def _engine(app: ScorekitApp) -> Engine:
    assert app.engine is not None
    return app.engine


@pytest.fixture(scope="module")
def tiny_ce(cross_encoder_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(str(cross_encoder_dir), name="tiny-ce"))
    with serve(app) as live:
        yield app, live


def _words(count: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i % 997}" for i in range(count))


def _documents(words: int) -> list[str]:
    return [" ".join(f"d{(i * 7 + j) % 501}" for j in range(words)) for i in range(DOCUMENTS)]


def _work(engine: Engine) -> int:
    """The engine's work counter once it has stopped moving (the last request's thread may still report)."""
    while True:
        seen = engine.snapshot().tokenizing.tokenize_work
        if not wait_for(lambda seen=seen: engine.snapshot().tokenizing.tokenize_work != seen, timeout=0.3):  # type: ignore[misc]
            return seen


def test_an_answered_long_query_costs_what_a_512_token_query_does_plus_reading_it(
    tiny_ce: tuple[ScorekitApp, Live], cross_encoder_dir: Path
) -> None:
    app, live = tiny_ce
    engine = _engine(app)
    tokenizer = AutoTokenizer.from_pretrained(cross_encoder_dir)
    short_words = next(n for n in range(100, 2000, 10) if len(tokenizer.tokenize(_words(n))) >= 512)
    documents = _documents(100)  # fewer tokens than either query: the same cut of both (longest first)
    measured = {}
    scores = {}
    for name, query in (("512 tokens", _words(short_words)), ("1.6M words", _words(QUERY_WORDS))):
        before = _work(engine)
        status, body = live.json(
            "POST", "/rerank", {"query": query, "documents": documents, "truncate_prompt_tokens": -1}
        )
        assert status == 200, body
        measured[name] = _work(engine) - before
        scores[name] = {result["index"]: result["relevance_score"] for result in body["results"]}
    ratio = measured["1.6M words"] / measured["512 tokens"]
    assert ratio <= 1.25, f"the long query cost {ratio:.2f}x a 512-token one ({measured})"
    # Both queries start with the same 512 tokens and are longer than every document, so the model keeps the
    # same first tokens of either.
    for index, score in scores["512 tokens"].items():
        assert math.isclose(scores["1.6M words"][index], score, abs_tol=1e-5)


def test_a_long_query_abandoned_while_tokenizing_stops_within_one_unit_of_work(
    tiny_ce: tuple[ScorekitApp, Live],
) -> None:
    app, live = tiny_ce
    engine = _engine(app)
    documents = _documents(20_000)  # 40 x ~130 KB: tokenizing them takes dozens of units
    body = json.dumps({"query": _words(QUERY_WORDS), "documents": documents, "truncate_prompt_tokens": -1}).encode()
    tokenized = ("scorekit_tokenize_duration_seconds_count", (("model", "tiny-ce"),))
    timings_before = scrape(live).get(tokenized, 0.0)
    before = _work(engine)
    start = engine.snapshot()
    chunks, stopped, after_abandon, items = (
        start.tokenizing.tokenize_chunks,
        start.tokenizing.tokenizing_stopped,
        start.tokenizing.work_after_abandon,
        start.worker.items,
    )

    sock = live.connect()
    sock.sendall(http_head("POST", "/rerank", {"Content-Type": "application/json", "Content-Length": str(len(body))}))
    sock.sendall(body)
    assert wait_for(lambda: engine.snapshot().tokenizing.tokenize_chunks >= chunks + 3, timeout=60), (
        "tokenizing never started"
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, as the attack
    sock.close()

    assert live.wait_load(0, timeout=10) == 0, "the abandoned request still counts as load"
    assert wait_for(lambda: engine.snapshot().tokenizing.tokenizing_stopped > stopped, timeout=10), (
        "tokenizing did not stop"
    )
    done = _work(engine) - before
    everything = sum(map(len, documents))
    assert done < everything / 2, f"{done} units of work were done for a client that had left"
    end = engine.snapshot()
    assert end.tokenizing.work_after_abandon - after_abandon <= CHUNK_CHARS
    assert end.tokenizing.largest_step <= CHUNK_CHARS
    assert end.worker.items == items, "the abandoned request reached the model"
    # What it cost is on record, though it never finished.
    assert wait_for(lambda: scrape(live).get(tokenized, 0.0) == timings_before + 1, timeout=10)


def test_a_query_that_leaves_no_room_for_a_document_token_is_refused_naming_it(
    tiny_ce: tuple[ScorekitApp, Live], cross_encoder_dir: Path
) -> None:
    """Scored by windows, a query of the model's length less the three special tokens leaves no room: a 400
    that names the query (not the document, though it is the longer text); one token less leaves windows of
    one token each."""
    _, live = tiny_ce
    tokenizer = AutoTokenizer.from_pretrained(cross_encoder_dir)
    room = MAX_POSITIONS - 3  # [CLS] query [SEP] document [SEP]
    assert len(tokenizer.tokenize("the " * room)) == room
    document = "bees make honey from nectar " * 40
    request = {"documents": ["short", document], "max_chunks_per_doc": 500, "return_chunks": True}
    status, body = live.json("POST", "/v1/rerank", {**request, "query": ("the " * room).strip()})
    assert status == 400, body
    error = body["error"]
    assert error["message"].startswith(f"query has {room} tokens"), error
    assert "no room for a document token" in error["message"] and "documents" not in error["message"], error
    status, body = live.json("POST", "/v1/rerank", {**request, "query": ("the " * (room - 1)).strip()})
    assert status == 200, body
    chunks = {result["index"]: result["chunk"] for result in body["results"]}
    assert chunks[1]["count"] == len(tokenizer.tokenize(document)), chunks
