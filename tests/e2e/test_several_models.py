"""Two models in one process (the embedded MiniLM and a tiny cross-encoder), each with its own engine.

Each answers with its own reference scores, a request's `model` picks one (none: the first), and the two
are independent: one model busy, abandoned by its client or with a dead worker leaves the other untouched.
The busy states are made deterministic by holding a model's forward on an event, not by timing.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.models import default_model_path
from scorekit.models.base import Encoded
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.e2e.texts import DOCS, QUERY, many_docs
from tests.live import Live, http_head, serve, wait_for

MINILM, TINY_CE = "minilm", "tiny-ce"


@pytest.fixture
def two_models(cross_encoder_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    small = EngineConfig(max_batch_size=4, max_batch_tokens=4096)
    settings = Settings(
        models=(
            ModelSpec(name=MINILM, engine=small),
            ModelSpec(path=str(cross_encoder_dir), name=TINY_CE, engine=small),
        )
    )
    app = create_app(settings)
    with serve(app) as live:
        yield app, live


def engine(app: ScorekitApp, name: str) -> Engine:
    found = app.models.get(name)
    assert found is not None
    return found


class Held:
    """Holds one model's forward at the start of each batch until released: the model is busy for certain."""

    def __init__(self, target: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        backend: Any = target.backend
        forward = backend.forward

        def held(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            self.entered.set()
            assert self.release.wait(120), "the test never released the model"
            return list(forward(batch))

        monkeypatch.setattr(backend, "forward", held)


def post_in_thread(live: Live, path: str, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}

    def run() -> None:
        answer["status"], answer["body"] = live.json("POST", path, body, timeout=120)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answer


def test_each_model_answers_with_its_own_reference_scores(
    two_models: tuple[ScorekitApp, Live], cross_encoder_dir: Path
) -> None:
    _, live = two_models
    bi = SentenceTransformer(default_model_path(), device="cpu")
    cosines = torch.nn.functional.cosine_similarity(torch.tensor(bi.encode([QUERY])), torch.tensor(bi.encode(DOCS)))
    logits = CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(QUERY, d) for d in DOCS]).tolist()
    for model, expected in [(MINILM, cosines.tolist()), (TINY_CE, logits), (None, cosines.tolist())]:
        body: dict[str, Any] = {"queries": QUERY, "documents": DOCS}
        if model is not None:
            body["model"] = model
        status, answer = live.json("POST", "/score", body)
        assert status == 200, answer
        assert answer["model"] == (model or MINILM)  # no model: the first one
        assert [d["score"] for d in answer["data"]] == pytest.approx(expected, abs=1e-5)
    status, ranked = live.json("POST", "/rerank", {"model": TINY_CE, "query": QUERY, "documents": DOCS})
    assert status == 200 and ranked["model"] == TINY_CE
    assert [r["index"] for r in ranked["results"]] == sorted(range(3), key=lambda i: -logits[i])
    status, missing = live.json("POST", "/score", {"model": "other", "queries": "q", "documents": ["d"]})
    assert (status, missing["error"]["param"]) == (404, "model")
    assert missing["error"]["message"] == "The model `other` does not exist."


def test_models_and_metrics_list_every_model(two_models: tuple[ScorekitApp, Live], cross_encoder_dir: Path) -> None:
    _, live = two_models
    status, listed = live.json("GET", "/v1/models")
    assert status == 200
    assert [card["id"] for card in listed["data"]] == [MINILM, TINY_CE]
    assert [card["root"] for card in listed["data"]] == [default_model_path(), str(cross_encoder_dir.resolve())]
    assert [card["max_model_len"] for card in listed["data"]] == [256, 128]
    assert live.json("POST", "/score", {"model": TINY_CE, "queries": "q", "documents": ["d"]})[0] == 200
    _, _, raw = live.request("GET", "/metrics")
    text = raw.decode()
    for name in (MINILM, TINY_CE):
        assert f'scorekit_queue_depth{{model="{name}"}} 0.0' in text
        assert f'scorekit_model_requests{{model="{name}"}} 0.0' in text
    assert f'scorekit_batch_size_count{{model="{TINY_CE}"}} 1.0' in text


def test_a_busy_model_does_not_hold_up_the_other(
    two_models: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, live = two_models
    held = Held(engine(app, TINY_CE), monkeypatch)
    big, answer = post_in_thread(live, "/rerank", {"model": TINY_CE, "query": QUERY, "documents": many_docs(40)})
    try:
        assert held.entered.wait(60), "the cross-encoder never started its batch"
        # The cross-encoder is mid-batch with most of the request queued: MiniLM still answers at once.
        for _ in range(3):
            status, body = live.json("POST", "/score", {"model": MINILM, "queries": QUERY, "documents": DOCS})
            assert status == 200, body
        assert big.is_alive() and engine(app, TINY_CE).snapshot().queued_items > 0
        assert engine(app, MINILM).snapshot().queued_items == 0 and engine(app, MINILM).active_requests == 0
    finally:
        held.release.set()
    big.join(120)
    assert answer["status"] == 200 and len(answer["body"]["results"]) == 40


def test_a_client_that_leaves_one_model_leaves_the_other_untouched(
    two_models: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, live = two_models
    minilm, tiny = engine(app, MINILM), engine(app, TINY_CE)
    held, held_tiny = Held(minilm, monkeypatch), Held(tiny, monkeypatch)
    waiting, answer = post_in_thread(live, "/rerank", {"model": MINILM, "query": QUERY, "documents": many_docs(12)})
    try:
        assert held.entered.wait(60)
        # The query and 12 documents are 13 texts to embed; batches of 4: one batch running, 9 texts queued.
        assert wait_for(lambda: minilm.snapshot().queued_items == 9)
        # A cross-encoder request whose client hangs up while its first batch runs (held) and the rest wait.
        body = json.dumps({"model": TINY_CE, "query": QUERY, "documents": many_docs(40)}).encode()
        head = {"content-type": "application/json", "content-length": str(len(body))}
        sock = live.connect()
        sock.sendall(http_head("POST", "/rerank", head) + body)
        assert held_tiny.entered.wait(60)
        assert wait_for(lambda: tiny.active_requests == 1 and tiny.snapshot().queued_items == 36, timeout=60)
        assert live.json("GET", "/load")[1] == {"server_load": 2, "models": {MINILM: 1, TINY_CE: 1}}
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
        assert wait_for(lambda: tiny.active_requests == 0 and tiny.snapshot().queued_items == 0, timeout=60)
        # The other model's request is exactly where it was.
        assert (minilm.active_requests, minilm.snapshot().queued_items) == (1, 9)
        assert waiting.is_alive()
        left = {"server_load": 1, "models": {MINILM: 1, TINY_CE: 0}}
        assert wait_for(lambda: live.json("GET", "/load")[1] == left), live.json("GET", "/load")[1]
    finally:
        held.release.set()
        held_tiny.release.set()
    waiting.join(120)
    assert answer["status"] == 200 and len(answer["body"]["results"]) == 12
    assert live.wait_load(0) == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_worker_turns_only_its_models_requests_away(
    two_models: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app, live = two_models
    caplog.set_level(logging.CRITICAL, logger="scorekit.worker")
    tiny = engine(app, TINY_CE)
    backend: Any = tiny.backend

    def fatal(batch: Sequence[Encoded]) -> list[torch.Tensor]:
        raise SystemExit("the model process is going away")

    monkeypatch.setattr(backend, "forward", fatal)
    pair = {"model": TINY_CE, "queries": "q", "documents": ["d"]}
    status, body = live.json("POST", "/score", pair)
    assert status == 500 and "worker died" in body["error"]["message"]
    assert wait_for(lambda: not tiny.health.ready)
    status, body = live.json("POST", "/score", pair)
    assert (status, body["error"]["message"]) == (503, f"The model `{TINY_CE}` is not ready.")
    # The other model serves on, and its requests never see the dead worker.
    for _ in range(3):
        status, body = live.json("POST", "/score", {"model": MINILM, "queries": QUERY, "documents": DOCS})
        assert status == 200, body
    assert engine(app, MINILM).health.ready
    status, _, raw = live.request("GET", "/health")
    assert status == 503 and f"The model `{TINY_CE}` worker died: SystemExit." in raw.decode()
