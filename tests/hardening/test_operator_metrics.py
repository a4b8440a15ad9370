"""The operator metrics after real traffic: where each request's time went (tokenizing, queue wait,
inference), the queued items and tokens, and the requests rejected, cancelled and failed, by reason.

The model is held on a batch while the queue is built up, so every count below is exact: which request
was queued, running, refused or abandoned is fixed by the test, never by timing.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import torch

from scorekit.engine import Engine
from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.e2e.test_several_models import Held, post_in_thread
from tests.hardening.conftest import Sample, docs, json_head, reset, running, scrape
from tests.live import Live, wait_for

MODEL = DEFAULT_MODEL_NAME


def _value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _leave(live: Live, path: str, body: dict[str, Any]) -> socket.socket:
    """A request sent on a raw socket, for a client that will leave before its answer."""
    data = json.dumps(body).encode()
    sock = socket.create_connection((live.host, live.port), timeout=30)
    sock.sendall(json_head(path, data) + data)
    return sock


def _settled(engine: Engine, queued: int) -> bool:
    return engine.snapshot().queued_items == queued


def test_operator_metrics_count_every_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Batches by size alone: a budget fitted to batch timings (one of them held) could split a request.
    # One thread and no small-job lane: with it held, every small request below queues.
    config = EngineConfig(
        max_batch_size=4, max_batch_tokens=4096, max_queued_items=16, batch_efficiency=None, small_job_lane=0
    )
    with running(Settings.for_model(engine=config)) as (app, live):
        engine = app.engine
        assert engine is not None
        before = scrape(live)

        for i in range(3):  # three texts each (the query once, two documents): one batch each
            assert live.json("POST", "/score", {"queries": "q", "documents": [f"d{i}", "e"]})[0] == 200
        too_long = {"queries": "q", "documents": ["word " * 600]}
        assert live.json("POST", "/score", too_long)[0] == 400
        assert live.json("POST", "/rerank", {"query": "q", "documents": docs(16)})[0] == 400  # 17 > 16 inputs

        held = Held(engine, monkeypatch)
        # Leaves while its first batch runs: 9 texts, 4 running (held), 5 queued and then dropped.
        first = _leave(live, "/rerank", {"query": "left running", "documents": docs(8)})
        try:
            assert held.entered.wait(60)
            assert wait_for(lambda: _settled(engine, 5), timeout=60)
            reset(first)
            assert wait_for(lambda: engine.active_requests == 0 and _settled(engine, 0), timeout=60)
            waiting, answer = post_in_thread(live, "/rerank", {"query": "waits", "documents": docs(3, words=3)})
            assert wait_for(lambda: _settled(engine, 4), timeout=60)
            # Leaves while queued: its 2 texts are dropped before they run.
            second = _leave(live, "/score", {"queries": "left queued", "documents": ["x"]})
            assert wait_for(lambda: _settled(engine, 6), timeout=60)
            reset(second)
            assert wait_for(lambda: _settled(engine, 4) and engine.active_requests == 1, timeout=60)
            during = scrape(live)
            assert _value(during, "scorekit_queue_depth", model=MODEL) == 4
            tokens = _value(during, "scorekit_queue_tokens", model=MODEL)
            assert tokens == engine.snapshot().queued_tokens and tokens >= 4 * 3  # [CLS] a word [SEP] at least
            # 4 queued + 14 texts > 16: refused at once.
            assert live.json("POST", "/rerank", {"query": "q", "documents": docs(13)})[0] == 503
        finally:
            held.release.set()
        waiting.join(120)
        assert answer["status"] == 200 and len(answer["body"]["results"]) == 3

        def broken(batch: Any) -> list[torch.Tensor]:
            raise RuntimeError("injected")

        monkeypatch.setattr(engine.backend, "forward", broken)
        assert live.json("POST", "/score", {"queries": "q", "documents": ["fails"]})[0] == 500
        assert wait_for(lambda: live.load() == 0)
        after = scrape(live)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    # Tokenized: the 3 scores, both leavers, the waiting rerank, the refused one (refused at the queue,
    # after tokenizing), the failing one, and the too-long one, refused while tokenizing: its tokenizing
    # time is what it cost, recorded like any other; the too-many one was refused before any.
    assert delta("scorekit_tokenize_duration_seconds_count", model=MODEL) == 9
    assert delta("scorekit_tokenize_duration_seconds_sum", model=MODEL) > 0
    # Started running: the 3 scores, the one that left running, the waiting rerank and the failing one.
    assert delta("scorekit_queue_duration_seconds_count", model=MODEL) == 6
    assert delta("scorekit_queue_duration_seconds_sum", model=MODEL) > 0
    # Batches that ran: one per score, the held one, the waiting rerank's one (4 texts); a failed one is not.
    batches = delta("scorekit_batch_size_count", model=MODEL)
    assert batches == 3 + 1 + 1
    assert delta("scorekit_inference_duration_seconds_count", model=MODEL) == batches
    assert delta("scorekit_inference_duration_seconds_sum", model=MODEL) > 0
    for reason in ("too_long", "too_many_inputs", "overloaded"):
        assert delta("scorekit_requests_rejected_total", model=MODEL, reason=reason) == 1, reason
    assert delta("scorekit_requests_rejected_total", model=MODEL, reason="queue_timeout") == 0
    assert delta("scorekit_requests_cancelled_total", model=MODEL, stage="running") == 1
    assert delta("scorekit_requests_cancelled_total", model=MODEL, stage="queued") == 1
    assert delta("scorekit_requests_cancelled_total", model=MODEL, stage="tokenizing") == 0
    assert delta("scorekit_requests_failed_total", model=MODEL, reason="model_error") == 1
    assert delta("scorekit_items_dropped_total", model=MODEL) == 5 + 2
    assert _value(after, "scorekit_queue_depth", model=MODEL) == 0
    assert _value(after, "scorekit_queue_tokens", model=MODEL) == 0
