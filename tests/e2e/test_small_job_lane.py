"""The small-job lane, through a real server: while a large request's batch runs (held on an event, not timed), a
small request runs on the lane's thread and gets its answer; the lane never takes the large request's items; and
without the lane the small request waits for the batch in flight."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sentence_transformers import CrossEncoder

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.e2e.test_model_workers import Gate, engine_of
from tests.e2e.texts import many_docs
from tests.live import Live, read_response, serve, wait_for

pytestmark = pytest.mark.e2e


def server(folder: Path, lane: int) -> Iterator[tuple[ScorekitApp, Live]]:
    spec = ModelSpec(str(folder), "ce", engine=EngineConfig(max_batch_size=4, small_job_lane=lane))
    app = create_app(Settings(models=(spec,)))
    with serve(app) as live:
        yield app, live


@pytest.fixture
def with_lane(cross_encoder_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    yield from server(cross_encoder_dir, lane=8)


@pytest.fixture
def without_lane(cross_encoder_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    yield from server(cross_encoder_dir, lane=0)


def test_a_small_request_is_answered_while_a_large_ones_batch_runs(
    with_lane: tuple[ScorekitApp, Live], cross_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, live = with_lane
    gate = Gate(engine_of(app), monkeypatch)
    large = many_docs(20)
    sock = live.send_json("/rerank", {"query": "a query", "documents": large})
    try:
        assert wait_for(lambda: gate.entered == 1, timeout=60)
        small = ["a small document", "another one", "a third"]
        status, answer = live.json("POST", "/score", {"queries": "a query", "documents": small}, timeout=60)
        assert status == 200, answer
        assert gate.entered == 1 and not gate.open.is_set()  # the large request's batch is still running
        reference = CrossEncoder(str(cross_encoder_dir), device="cpu").predict([("a query", d) for d in small])
        assert [row["score"] for row in answer["data"]] == pytest.approx(reference.tolist(), abs=1e-5)
    finally:
        gate.open.set()
    with sock:
        status, _, body = read_response(sock)
    assert status == 200 and len(json.loads(body)["results"]) == 20
    assert gate.lane_batches == [3]  # the lane ran the small request, and nothing of the large one
    assert live.wait_load(0) == 0


def test_without_the_lane_a_small_request_waits_for_the_batch_in_flight(
    without_lane: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, live = engine_of(without_lane[0]), without_lane[1]
    gate = Gate(engine, monkeypatch)
    sock = live.send_json("/rerank", {"query": "a query", "documents": many_docs(20)})
    try:
        assert wait_for(lambda: gate.entered == 1, timeout=60)
        small = live.send_json("/rerank", {"query": "a query", "documents": ["a small document"]})
        # The one thread holds the large request's batch, so the small one stays queued, whole.
        assert wait_for(
            lambda: engine.active_requests == 2 and engine.snapshot().queued_items == 20 - 4 + 1, timeout=60
        )
    finally:
        gate.open.set()
    for answered, count in ((small, 1), (sock, 20)):
        with answered:
            status, _, body = read_response(answered)
        assert status == 200 and len(json.loads(body)["results"]) == count
    assert gate.lane_batches == []
    assert live.wait_load(0) == 0
