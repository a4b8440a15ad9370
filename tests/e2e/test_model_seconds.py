"""What each request cost on the model, over real sockets: the ``x-model-seconds`` header (the request's share of
every batch its items rode in, by their tokens) and ``scorekit_model_seconds_total{model, key}``, whose sums over
the requests equal the worker's busy time, in process and with the model in a model host process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.settings import DEFAULT_MODEL_NAME, ApiKey, EngineConfig, Settings
from tests.e2e.test_priority_and_deadlines import BLOCKER, Recorded, finished, post
from tests.e2e.texts import many_docs
from tests.hardening.conftest import scrape
from tests.live import Live, serve, wait_for

pytestmark = pytest.mark.e2e

KEYS = (ApiKey("alpha-61d2e0", name="alpha"), ApiKey("beta-0c9a77", name="beta"))
SMALL = EngineConfig(max_batch_size=8, max_batch_tokens=4096)


def _engine(app: ScorekitApp) -> Engine:
    assert app.engine is not None
    return app.engine


def _load(live: Live, keys: tuple[ApiKey, ...]) -> dict[str, float]:
    """Eight requests of several sizes at once, half of them per key (none without keys): the model seconds each
    answer's header gave, summed by key."""
    billed: dict[str, float] = {}
    lock = threading.Lock()

    def one(n: int) -> None:
        key = keys[n % len(keys)] if keys else None
        headers = {"Authorization": f"Bearer {key.key}"} if key else {}
        body = {"query": f"query {n}", "documents": many_docs(3 + 7 * n)}
        status, answer, _ = live.request("POST", "/rerank", body, headers=headers, timeout=60)
        assert status == 200
        with lock:
            name = key.name if key and key.name else ""
            billed[name] = billed.get(name, 0.0) + float(answer["x-model-seconds"])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return billed


@pytest.fixture(scope="module")
def keyed() -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(engine=SMALL, api_keys=KEYS))
    with serve(app) as live:
        yield app, live


def _counted(before: dict[Any, float], after: dict[Any, float], key: str) -> float:
    sample = ("scorekit_model_seconds_total", (("key", key), ("model", DEFAULT_MODEL_NAME)))
    return after[sample] - before.get(sample, 0.0)


def test_the_requests_model_seconds_add_up_to_the_workers_busy_time(keyed: tuple[ScorekitApp, Live]) -> None:
    app, live = keyed
    engine = _engine(app)
    before, busy = scrape(live), engine.snapshot().worker.busy_seconds
    billed = _load(live, KEYS)
    after, busy = scrape(live), engine.snapshot().worker.busy_seconds - busy
    assert busy > 0 and set(billed) == {"alpha", "beta"}
    assert sum(billed.values()) == pytest.approx(busy, rel=0.05)
    for key, seconds in billed.items():  # the counter by key is what the headers said
        assert _counted(before, after, key) == pytest.approx(seconds, rel=1e-3, abs=1e-5)


def test_a_batch_s_time_is_split_by_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two one-input requests in one batch, of 3 and 9 tokens: the second is billed three times the first, and
    the two make the batch's whole time."""
    app = create_app(Settings.for_model(engine=EngineConfig(max_batch_size=8, small_job_lane=0)))
    with serve(app) as live:
        engine = _engine(app)
        recorded = Recorded(engine, monkeypatch)
        blocker = post(live, {"input": "zero"})
        assert recorded.entered.wait(30)
        short = post(live, {"input": "one"})
        assert wait_for(lambda: engine.snapshot().queued_items == 1)  # queued in this order, whatever the machine
        long = post(live, {"input": BLOCKER})
        assert wait_for(lambda: engine.snapshot().queued_items == 2)
        recorded.release.set()
        finished(blocker, short, long)
        busy = engine.snapshot().worker.busy_seconds
    assert recorded.batches[1] == [3, 9]
    seconds = [float(answer["headers"]["x-model-seconds"]) for answer in (blocker, short, long)]
    assert seconds[2] == pytest.approx(3 * seconds[1], rel=1e-3)
    assert sum(seconds) == pytest.approx(busy, rel=1e-3)


def test_only_a_request_whose_work_was_queued_is_billed(minilm: Live) -> None:
    for path in ("/health", "/v1/models", "/metrics"):
        assert "x-model-seconds" not in minilm.request("GET", path)[1]
    status, headers, _ = minilm.request("POST", "/score", {"queries": "q", "documents": []})
    assert status == 400 and "x-model-seconds" not in headers
    status, headers, _ = minilm.request("POST", "/score", {"queries": "q", "documents": ["d"]})
    assert status == 200 and float(headers["x-model-seconds"]) > 0


def test_a_model_host_process_bills_its_batches_as_well() -> None:
    app = create_app(Settings.for_model(engine=SMALL, host="process"))
    with serve(app) as live:
        engine = _engine(app)
        busy = engine.snapshot().worker.busy_seconds
        before = scrape(live)
        billed = _load(live, ())
        busy = engine.snapshot().worker.busy_seconds - busy
        after = scrape(live)
    assert busy > 0 and sum(billed.values()) == pytest.approx(busy, rel=0.05)
    assert _counted(before, after, "") == pytest.approx(billed[""], rel=1e-3, abs=1e-5)
