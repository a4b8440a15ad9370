"""A client that leaves stops its work at every stage, tokenizing included; impossible requests cost nothing.

Counted by the engine, not by the clock (read through ``Engine.snapshot``): ``EngineStats.tokenize_chunks``
counts bounded chunks of tokenizing (about 64 KiB of text each), ``tokenizing_stopped`` counts tokenizing threads
that met their checkpoint after their request had gone, and the worker counts the items that reached the model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from scorekit.api import common
from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.http import Request
from scorekit.schemas import RerankRequest
from scorekit.settings import EngineConfig, Settings
from tests.live import Live, http_head, serve, wait_for

DOCUMENTS = 60
# Each document is longer than one tokenizing chunk, so each is a chunk of its own (~0.05-0.2 s here).
LONG_DOCUMENT_WORDS = 14_000


def _engine(app: ScorekitApp) -> Engine:
    assert app.engine is not None
    return app.engine


def _long_documents() -> list[str]:
    return [" ".join(f"w{(i * 31 + j) % 997}" for j in range(LONG_DOCUMENT_WORDS)) for i in range(DOCUMENTS)]


def test_a_client_that_leaves_while_its_documents_tokenize_stops_the_tokenizing(
    served_minilm: Live, served_minilm_app: ScorekitApp
) -> None:
    live, engine = served_minilm, _engine(served_minilm_app)
    body = {"query": "w3 w5", "documents": _long_documents(), "truncate_prompt_tokens": -1}
    raw = json.dumps(body).encode()
    head = http_head("POST", "/rerank", {"Content-Type": "application/json", "Content-Length": str(len(raw))})
    start = engine.snapshot()
    chunks_before, stopped_before = start.tokenizing.tokenize_chunks, start.tokenizing.tokenizing_stopped
    items_before = start.worker.items

    sock = live.connect()
    sock.sendall(head + raw)
    assert wait_for(lambda: engine.snapshot().tokenizing.tokenize_chunks >= chunks_before + 2, timeout=60), (
        "tokenizing never started"
    )
    sock.close()

    assert live.wait_load(0, timeout=10) == 0, "the abandoned request still counts as load"
    assert wait_for(lambda: engine.snapshot().tokenizing.tokenizing_stopped > stopped_before, timeout=10), (
        "tokenizing did not stop"
    )
    stopped = engine.snapshot()
    chunks_at_stop = stopped.tokenizing.tokenize_chunks
    ran = chunks_at_stop - chunks_before
    assert ran < DOCUMENTS, f"all {ran} chunks were tokenized for a client that had left"
    assert stopped.worker.items == items_before, "the abandoned request reached the model"
    # Nothing more is tokenized for it afterwards (other requests could not add chunks: none are running).
    status, _ = live.json("GET", "/health")
    assert status == 200 and engine.snapshot().tokenizing.tokenize_chunks == chunks_at_stop


@pytest.fixture(scope="module")
def small_queue_lm(causal_lm_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(str(causal_lm_dir), engine=EngineConfig(max_queued_items=100)))
    with serve(app) as live:
        yield app, live


def test_a_request_larger_than_the_queue_is_refused_before_tokenizing(
    small_queue_lm: tuple[ScorekitApp, Live],
) -> None:
    app, live = small_queue_lm
    engine = _engine(app)
    query = " ".join(f"w{i % 50}" for i in range(30_000))
    items = [f"item {i} " * 20 for i in range(10_000)]
    chunks_before = engine.snapshot().tokenizing.tokenize_chunks
    status, body = live.json("POST", "/generative_scoring", {"query": query, "items": items, "label_token_ids": [1]})
    assert status == 400 and "queues at most 100" in body["error"]["message"], body
    assert engine.snapshot().tokenizing.tokenize_chunks == chunks_before, (
        "the request was tokenized before it was refused"
    )


def test_an_over_long_text_is_refused_by_its_characters_before_tokenizing(
    served_minilm: Live, served_minilm_app: ScorekitApp
) -> None:
    engine = _engine(served_minilm_app)
    chunks_before = engine.snapshot().tokenizing.tokenize_chunks
    huge = "word " * 200_000  # 1 MB: far past what 256 tokens can hold
    status, body = served_minilm.json("POST", "/rerank", {"query": "q", "documents": ["short", huge]})
    assert status == 400, body
    error = body["error"]
    assert error["param"] == "input_tokens" and "documents[1] has 1000000 characters" in error["message"], error
    assert engine.snapshot().tokenizing.tokenize_chunks == chunks_before
    # With truncation the same document is legitimate work.
    status, body = served_minilm.json(
        "POST", "/rerank", {"query": "q", "documents": ["short", huge], "truncate_prompt_tokens": -1}
    )
    assert status == 200 and len(body["results"]) == 2


def test_a_large_body_decodes_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 15 MB list of five million empty documents: decoding must not hold the event loop, and the count
    limit answers before any per-document pass."""
    threads: list[threading.Thread] = []
    real = common._decoder

    def recording(kind: type[msgspec.Struct]) -> msgspec.json.Decoder[msgspec.Struct]:
        decoder = real(kind)

        class Recorder:
            def decode(self, body: bytes) -> msgspec.Struct:
                threads.append(threading.current_thread())
                return decoder.decode(body)

        return Recorder()  # type: ignore[return-value]

    monkeypatch.setattr(common, "_decoder", recording)
    small = b'{"query": "q", "documents": ["d"]}'
    large = b'{"query": "q", "documents": [' + b",".join([b'""'] * 5_000_001) + b"]}"

    async def decode_both() -> threading.Thread:
        loop_thread = threading.current_thread()
        for body in (small, large):
            request = Request("POST", "/rerank", {"content-type": "application/json"}, body, None)
            decoded = await common.decode(request, RerankRequest)
            assert len(decoded.documents) in (1, 5_000_001)
        return loop_thread

    loop_thread = anyio.run(decode_both)
    assert threads[0] is loop_thread and threads[1] is not loop_thread
