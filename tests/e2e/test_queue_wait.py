"""``max_queue_wait`` end to end: a request still queued at its deadline is answered 503 with Retry-After and
none of its work runs, while a request whose first batch is running is never cut, however long it waits.

The model is held on its first batch (``Held``), so the second request cannot start before its deadline on
any machine, and the deadline is the only thing that can answer it before the model is released.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.e2e.test_several_models import Held, post_in_thread
from tests.e2e.texts import QUERY, many_docs
from tests.hardening.conftest import scrape
from tests.live import Live, serve

LIMIT = 1.0  # seconds: long enough for an idle worker to pick up a request on a loaded machine


@pytest.fixture
def waiting_server() -> Iterator[tuple[ScorekitApp, Live]]:
    # No small-job lane: with the one worker thread held, a late request can only wait.
    engine = EngineConfig(max_batch_size=4, max_batch_tokens=4096, max_queue_wait=LIMIT, small_job_lane=0)
    app = create_app(Settings.for_model(engine=engine))
    with serve(app) as live:
        yield app, live


def test_a_request_queued_past_the_deadline_gets_503_and_never_runs(
    waiting_server: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, live = waiting_server
    engine = app.engine
    assert engine is not None
    before = scrape(live)
    held = Held(engine, monkeypatch)
    # The query and 8 documents are 9 texts to embed: a batch of 4 runs (held), 5 wait behind it.
    running, answer = post_in_thread(live, "/rerank", {"query": QUERY, "documents": many_docs(8)})
    try:
        assert held.entered.wait(60), "the model never started the first request's batch"
        status, headers, raw = live.request("POST", "/score", {"queries": "late", "documents": ["never run"]})
        assert status == 503 and headers["retry-after"] == "1"
        message = json.loads(raw)["error"]["message"]
        assert f"waited more than {LIMIT:g} s in the queue before any of it ran" in message
        assert engine.snapshot().queued_items == 5  # only the running request's texts wait
        assert running.is_alive() and engine.snapshot().worker.items == 0
    finally:
        held.release.set()
    running.join(120)
    # The running request waited far past the limit for its later batches and was not cut.
    assert answer["status"] == 200 and len(answer["body"]["results"]) == 8
    assert engine.snapshot().worker.items == 9  # its 9 texts; nothing of the late request
    after = scrape(live)
    labels = (("model", DEFAULT_MODEL_NAME), ("reason", "queue_timeout"))
    assert (
        after[("scorekit_requests_rejected_total", labels)]
        - before.get(("scorekit_requests_rejected_total", labels), 0.0)
        == 1
    )
    queued_for = ("scorekit_queue_duration_seconds_count", (("model", DEFAULT_MODEL_NAME),))
    assert after[queued_for] - before.get(queued_for, 0.0) == 1  # the request that ran; the late one never did
