"""Disconnect storm: 500 raw-socket clients that leave at random moments leak nothing.

Each client picks one way to go: after the headers only, part-way through the body, right after the
whole body, while the model runs (a random sleep after the body), or it stays and reads its 200. Half
of those that leave close with an RST instead of a FIN. A warm-up round of the same mix comes first,
so the thread pools, allocator arenas and caches are at their steady state before anything is counted.

What is counted, and how:
- load: ``/load`` (scoring requests in flight) and ``app.load.total`` (every HTTP request inside the
  lifecycle layer), both 0 afterwards; the engine's admitted-request count and the batcher's queue, 0;
- tasks: ``asyncio.all_tasks()`` on the server's own event loop, read by a test-only route that runs
  there (so the count includes that probe request's own tasks, the same before and after);
- threads: ``threading.enumerate()`` in this process, which holds the server, its model worker and its
  anyio worker threads (idle anyio workers may expire, so the count may drop, never grow);
- memory: VmRSS of this process from /proc/self/status, within 10% of the post-warm-up figure.
The storm also has to have reached the model: some requests are recorded as 499 (client closed) and
some queued items were dropped because their client left.
"""

from __future__ import annotations

import gc
import json
import random
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from scorekit.app import ScorekitApp
from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.hardening.conftest import docs, json_head, read_response, reset, rss_kib, running, scrape, server_tasks
from tests.live import Live

CLIENT_TIMEOUT = 30
STORM = 500
WARM_UP = 150
WAYS = ("headers only", "mid body", "after body", "while running", "stays")
BODY = json.dumps({"query": "topic 3 in some detail", "documents": docs(8)}).encode()


def _client(live: Live, way: str, rng: random.Random) -> int | None:
    """Play one client; return the status if it stayed for the answer."""
    sock = socket.create_connection((live.host, live.port), timeout=CLIENT_TIMEOUT)
    rude = rng.random() < 0.5
    try:
        sock.sendall(json_head("/rerank", BODY))
        if way == "headers only":
            time.sleep(rng.uniform(0, 0.01))
            return None
        if way == "mid body":
            sock.sendall(BODY[: rng.randrange(1, len(BODY))])
            time.sleep(rng.uniform(0, 0.01))
            return None
        sock.sendall(BODY)
        if way == "after body":
            return None
        if way == "while running":
            time.sleep(rng.uniform(0.002, 0.06))
            return None
        status, _, _ = read_response(sock)
        return status
    finally:
        if rude:
            reset(sock)
        else:
            sock.close()


def _round(live: Live, count: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    plan = [(rng.choice(WAYS), random.Random(rng.random())) for _ in range(count)]
    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda step: _client(live, *step), plan))
    stayed = [status for status in statuses if status is not None]
    assert stayed and all(status == 200 for status in stayed), Counter(stayed)
    return Counter(way for way, _ in plan)


def _settle(app: ScorekitApp, live: Live, tasks: int) -> None:
    engine = app.engine
    assert engine is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        idle = app.load.total == 0 and engine.snapshot().queued_items == 0 and engine.active_requests == 0
        if idle and live.load() == 0 and server_tasks(live) <= tasks:
            return
        time.sleep(0.05)
    raise AssertionError(
        f"not idle: load.total={app.load.total} routed={live.load()} queued={engine.snapshot().queued_items} "
        f"active={engine.active_requests} tasks={server_tasks(live)} (baseline {tasks})"
    )


def test_disconnect_storm_leaks_nothing() -> None:
    with running(Settings.for_model(engine=EngineConfig(max_batch_size=16, max_batch_tokens=4096))) as (app, live):
        _round(live, WARM_UP, seed=1)
        time.sleep(0.2)
        tasks = server_tasks(live)
        _settle(app, live, tasks)
        gc.collect()
        threads = threading.active_count()
        thread_names = sorted(thread.name for thread in threading.enumerate())
        rss = rss_kib()
        before = scrape(live)

        ways = _round(live, STORM, seed=2)
        assert all(ways[way] > STORM // 10 for way in WAYS), ways

        _settle(app, live, tasks)
        gc.collect()
        after = scrape(live)
        # (_settle saw app.load.total == 0 before any probe; read now, it would count a probe that has
        # answered but not yet left the lifecycle layer.)
        assert live.load() == 0
        assert server_tasks(live) <= tasks
        assert threading.active_count() <= threads, (
            thread_names,
            sorted(thread.name for thread in threading.enumerate()),
        )
        assert rss_kib() <= rss * 1.10, (rss, rss_kib())

        def delta(name: str, **labels: str) -> float:
            key = (name, tuple(sorted(labels.items())))
            return after.get(key, 0.0) - before.get(key, 0.0)

        # The storm reached every stage: requests cut off (499), and queued items dropped unrun.
        assert delta("scorekit_requests_total", route="/rerank", status="499") > STORM // 5
        assert delta("scorekit_items_dropped_total", model=DEFAULT_MODEL_NAME) > 0
        assert delta("scorekit_requests_total", route="/rerank", status="200") >= ways["stays"]
        # And it still answers normally.
        status, body = live.json("POST", "/rerank", {"query": "q", "documents": ["a", "b"]})
        assert status == 200 and len(body["results"]) == 2
