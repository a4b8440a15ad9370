"""/metrics moves with the traffic: load per route and in total, requests by route and status, latency,
batch size and tokens, queue depth, and items dropped because their client left.

Parsed with prometheus_client's own text parser. The gauges are sampled while a 2000-document rerank
runs on small batches; the drop counter moves after a client of such a rerank hangs up mid-way.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.hardening.conftest import Sample, docs, json_head, reset, running, scrape
from tests.live import Live, settled_stats

MODEL = DEFAULT_MODEL_NAME  # the label of every per-model metric of the one served model
BIG = {"query": "topic 3 in some detail", "documents": docs(2000, words=4), "return_documents": False}


def _value(samples: dict[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _until(condition: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _during_big_rerank(live: Live) -> dict[Sample, float]:
    """A scrape taken while a 2000-document rerank is being scored."""
    done = threading.Event()

    def big() -> None:
        status, body = live.json("POST", "/rerank", BIG, timeout=120)
        assert status == 200 and len(body["results"]) == 2000
        done.set()

    thread = threading.Thread(target=big)
    thread.start()
    samples: dict[Sample, float] = {}

    def busy() -> bool:
        samples.update(scrape(live))
        return _value(samples, "scorekit_queue_depth", model=MODEL) > 0 or done.is_set()

    _until(busy)
    thread.join(120)
    assert done.is_set()
    return samples


def test_metrics_move_with_traffic() -> None:
    with running(Settings.for_model(engine=EngineConfig(max_batch_size=16, max_batch_tokens=4096))) as (app, live):
        before = scrape(live)

        for i in range(3):
            assert live.json("POST", "/score", {"queries": "q", "documents": [f"d{i}", "e"]})[0] == 200
        assert live.json("POST", "/score", {"queries": [], "documents": ["d"]})[0] == 400
        assert live.json("POST", "/v1/score", {"queries": "q", "documents": "d"})[0] == 200
        assert live.json("POST", "/nowhere", {})[0] == 404

        during = _during_big_rerank(live)
        assert _value(during, "scorekit_route_load", route="/rerank") == 1
        assert _value(during, "scorekit_load") >= 2  # the rerank, and this scrape itself
        assert _value(during, "scorekit_queue_depth", model=MODEL) > 0

        # A client that leaves during a 2000-document rerank: its queued items are dropped, counted as 499.
        body = json.dumps(BIG).encode()
        sock = socket.create_connection((live.host, live.port), timeout=30)
        sock.sendall(json_head("/rerank", body) + body)
        engine = app.engine
        assert engine is not None
        batches = engine.snapshot().worker.batches
        _until(lambda: engine.snapshot().worker.batches >= batches + 2)
        reset(sock)
        _until(lambda: live.load() == 0)
        # The batch running when the client left still lands after its request ended: scrape once it has.
        stats = settled_stats(app)

        after = scrape(live)

        def delta(name: str, **labels: str) -> float:
            return _value(after, name, **labels) - _value(before, name, **labels)

        assert delta("scorekit_requests_total", route="/score", status="200") == 4  # the alias counts as /score
        assert delta("scorekit_requests_total", route="/score", status="400") == 1
        assert delta("scorekit_requests_total", route="unmatched", status="404") == 1
        assert delta("scorekit_requests_total", route="/rerank", status="200") == 1
        assert delta("scorekit_requests_total", route="/rerank", status="499") == 1
        assert delta("scorekit_request_duration_seconds_count", route="/score") == 5
        assert delta("scorekit_request_duration_seconds_sum", route="/score") > 0
        assert delta("scorekit_request_duration_seconds_count", route="/rerank") == 2
        assert _value(after, "scorekit_request_duration_seconds_bucket", route="/rerank", le="+Inf") == 2
        # A 2000-document rerank takes longer than five one-batch /score requests together.
        assert delta("scorekit_request_duration_seconds_sum", route="/rerank") > delta(
            "scorekit_request_duration_seconds_sum", route="/score"
        )

        batch_count = delta("scorekit_batch_size_count", model=MODEL)
        assert batch_count >= 2000 / 16
        assert delta("scorekit_batch_size_sum", model=MODEL) >= 2001 + 4 * 2  # every item that ran is in some batch
        assert _value(after, "scorekit_batch_size_bucket", model=MODEL, le="16.0") == _value(
            after, "scorekit_batch_size_count", model=MODEL
        )
        assert delta("scorekit_batch_tokens_count", model=MODEL) == batch_count
        assert delta("scorekit_batch_tokens_sum", model=MODEL) > delta(
            "scorekit_batch_size_sum", model=MODEL
        )  # more than a token per item

        dropped = delta("scorekit_items_dropped_total", model=MODEL)
        assert 0 < dropped <= 2001
        assert stats.items_of_cancelled_jobs <= 16  # at most the batch running when it left

        # Back to idle: the load gauges fall to 0 (a route with no load is left out), the queue is empty.
        assert _value(after, "scorekit_route_load", route="/rerank") == 0
        assert _value(after, "scorekit_queue_depth", model=MODEL) == 0
        assert _value(after, "scorekit_load") == 1  # this scrape
