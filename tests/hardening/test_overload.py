"""Overload: far more concurrent clients than the limits admit. The excess gets fast 503s with Retry-After
in the error shape, every admitted request succeeds with the scores a lone request gets, and the load
returns to 0.

Each client is a thread with its own connection; a barrier releases all 64 at once. Small batches make
an admitted request span several model batches, so it is still running when the others arrive.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from scorekit.app import ScorekitApp
from scorekit.settings import EngineConfig, Settings
from tests.hardening.conftest import docs, error_of, running
from tests.live import Live, close_answers

CLIENTS = 64


Answer = tuple[int, dict[str, str], bytes]


def _storm(live: Live, app: ScorekitApp, body: dict[str, Any]) -> tuple[list[Answer], int, int]:
    """Fire CLIENTS copies of ``body`` at once; return (status, headers, body) each, the most requests the
    engine ever held admitted at one time, and how many items the model ran for them."""
    barrier = threading.Barrier(CLIENTS)
    engine = app.engine
    assert engine is not None
    items_before = engine.snapshot().worker.items
    peak = 0
    watching = True

    def watch() -> None:
        nonlocal peak
        while watching:
            peak = max(peak, engine.active_requests)
            time.sleep(0.0005)

    def client(_: int) -> Answer:
        barrier.wait()
        return live.request("POST", "/rerank", body, timeout=60)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(client, range(CLIENTS)))
    finally:
        watching = False
        watcher.join()
    return results, peak, engine.snapshot().worker.items - items_before


def _check(live: Live, results: list[Answer], expected: Lone, items_run: int, says: str) -> None:
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    assert len(ok) + len(busy) == CLIENTS, sorted({r[0] for r in results})
    assert len(ok) >= 1 and len(busy) >= CLIENTS // 2, (len(ok), len(busy))
    for status, headers, raw in busy:
        error = error_of(status, raw, 503)
        assert headers.get("retry-after") == "1"
        assert says in error["message"], error
    for _, _, raw in ok:
        got = json.loads(raw)["results"]
        assert [r["index"] for r in got] == [r["index"] for r in expected.results]
        assert all(
            math.isclose(a["relevance_score"], b["relevance_score"], abs_tol=1e-5)
            for a, b in zip(got, expected.results, strict=True)
        )
    # A 503 is answered without touching the model: it ran the admitted requests' items and nothing more.
    assert items_run == len(ok) * expected.items, (items_run, len(ok), expected.items)
    assert live.wait_load(0) == 0


@dataclass(frozen=True)
class Lone:
    """A request's answer when it runs alone, and the items the model ran for it."""

    results: list[dict[str, Any]]
    items: int


def _lone(live: Live, app: ScorekitApp, body: dict[str, Any]) -> Lone:
    assert app.engine is not None
    before = app.engine.snapshot().worker.items
    status, payload = live.json("POST", "/rerank", body)
    assert status == 200
    return Lone(payload["results"], app.engine.snapshot().worker.items - before)


def _with(settings: Settings, test: Callable[[ScorekitApp, Live], None]) -> None:
    with running(settings) as (app, live):
        test(app, live)


def test_max_concurrent_requests_sheds_the_excess() -> None:
    body = {"query": "topic 3 in detail", "documents": docs(64)}

    def test(app: ScorekitApp, live: Live) -> None:
        expected = _lone(live, app, body)
        results, peak, items_run = _storm(live, app, body)
        assert peak <= 4, peak
        _check(live, results, expected, items_run, "requests in flight: 4, the limit")
        assert app.engine is not None and app.engine.active_requests == 0
        # Still serving, the same answer: to 1e-5, since the storm retrained the batch-cost fit, and the lone
        # request's items may now be batched otherwise.
        again = _lone(live, app, body)
        assert again.items == expected.items and close_answers(again.results, expected.results)

    _with(Settings.for_model(engine=EngineConfig(max_concurrent_requests=4, max_batch_size=8)), test)


def test_max_queued_items_sheds_the_excess() -> None:
    # 64 documents + the query are 65 queued items: two such requests do not fit in 100.
    body = {"query": "topic 3 in detail", "documents": docs(64)}

    def test(app: ScorekitApp, live: Live) -> None:
        expected = _lone(live, app, body)
        results, _, items_run = _storm(live, app, body)
        _check(live, results, expected, items_run, "items are queued")
        assert app.engine is not None and app.engine.snapshot().queued_items == 0

    _with(Settings.for_model(engine=EngineConfig(max_queued_items=100, max_batch_size=8)), test)


def test_a_request_larger_than_the_whole_queue_is_a_400_not_a_503() -> None:
    # 150 documents + the query can never fit in a queue of 100: retrying (what a 503 asks for) cannot help.
    def test(app: ScorekitApp, live: Live) -> None:
        status, headers, raw = live.request("POST", "/rerank", {"query": "q", "documents": docs(150)})
        error = error_of(status, raw, 400)
        assert "151" in error["message"] and "100" in error["message"]
        assert "retry-after" not in headers
        assert app.engine is not None and app.engine.snapshot().queued_items == 0
        assert _lone(live, app, {"query": "q", "documents": docs(50)}).results  # one that fits still runs

    _with(Settings.for_model(engine=EngineConfig(max_queued_items=100)), test)
