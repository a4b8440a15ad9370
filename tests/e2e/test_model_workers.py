"""``--model-workers 2``: two threads run one model's batches side by side, through a real server, in torch and in
OpenVINO.

Answers are the model's reference scores whatever batch, thread or partner batch an item ran in; the two
threads really ran batches at once; and a client that leaves while both threads hold one of its batches
wastes those two batches and nothing more, with the load back at 0. Busy states are made certain by holding
the forward on an event, not by timing.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import CrossEncoder

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.models.base import Encoded
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.e2e.test_runtimes import needs_openvino
from tests.e2e.texts import many_docs
from tests.live import Live, serve, settled_stats, wait_for

pytestmark = pytest.mark.e2e

BATCH = 2  # items per batch: a request of many documents makes many batches for the two threads


@pytest.fixture(params=["torch", pytest.param("openvino", marks=needs_openvino)])
def two_threads(
    request: pytest.FixtureRequest, cross_encoder_dir: Path, tmp_path: Path
) -> Iterator[tuple[ScorekitApp, Live]]:
    """A server whose model runs on two threads, in torch or in OpenVINO (two streams, an infer request each)."""
    engine = EngineConfig(max_batch_size=BATCH, model_workers=2)
    spec = ModelSpec(str(cross_encoder_dir), "ce", engine=engine, runtime=request.param, cache_dir=str(tmp_path))
    app = create_app(Settings(models=(spec,)))
    with serve(app) as live:
        yield app, live


def engine_of(app: ScorekitApp) -> Engine:
    engine = app.engine
    assert engine is not None
    return engine


def test_concurrent_requests_get_the_reference_scores(
    two_threads: tuple[ScorekitApp, Live], cross_encoder_dir: Path
) -> None:
    app, live = two_threads
    reference = CrossEncoder(str(cross_encoder_dir), device="cpu")
    bodies = [{"queries": f"query number {n}", "documents": many_docs(12 + n)} for n in range(8)]

    def score(body: dict[str, Any]) -> list[float]:
        status, answer = live.json("POST", "/score", body, timeout=120)
        assert status == 200, answer
        return [row["score"] for row in answer["data"]]

    with ThreadPoolExecutor(len(bodies)) as clients:
        answers = list(clients.map(score, bodies))
    for body, got in zip(bodies, answers, strict=True):
        pairs = [(body["queries"], document) for document in body["documents"]]
        assert got == pytest.approx(reference.predict(pairs).tolist(), abs=1e-5)
    stats = engine_of(app).snapshot().worker
    assert stats.items == sum(len(body["documents"]) for body in bodies)
    assert stats.most_busy == 2  # the two threads ran batches at once
    assert live.wait_load(0) == 0


LANE = "scorekit-model-lane"  # the small-job lane's thread (scorekit/worker.py)


class Gate:
    """Holds every forward of the worker's own threads until opened, counting the forwards that reached it; the
    small-job lane's forwards run at once, their sizes recorded (tests/e2e/test_small_job_lane.py)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.entered = 0
        self.lane_batches: list[int] = []
        self._lock = threading.Lock()
        backend: Any = engine.backend
        forward = backend.forward

        def held(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            if threading.current_thread().name == LANE:
                self.lane_batches.append(len(batch))
                return list(forward(batch))
            with self._lock:
                self.entered += 1
            assert self.open.wait(120), "the test never opened the gate"
            return list(forward(batch))

        monkeypatch.setattr(backend, "forward", held)


def test_a_client_that_leaves_wastes_only_the_two_batches_in_flight(
    two_threads: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, live = two_threads
    engine = engine_of(app)
    gate = Gate(engine, monkeypatch)
    documents = many_docs(40)
    sock = live.send_json("/rerank", {"query": "a query", "documents": documents})
    try:
        # Both threads hold one of its batches (both were waiting when it was queued: one wakes the other).
        assert wait_for(lambda: gate.entered == 2, timeout=60), (gate.entered, engine.snapshot().queued_items)
        assert engine.snapshot().queued_items == len(documents) - 2 * BATCH
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
        assert wait_for(lambda: engine.active_requests == 0 and engine.snapshot().queued_items == 0, timeout=60)
    finally:
        gate.open.set()
    assert live.wait_load(0) == 0
    # Read once both held batches have ended: a thread updates the counters one after another under the worker's
    # lock, so a read while the second batch lands can see its batch counted and not yet its items.
    stats = settled_stats(app)
    assert (stats.batches, stats.items, stats.items_of_cancelled_jobs) == (2, 2 * BATCH, 2 * BATCH)
    # The threads serve on.
    status, answer = live.json("POST", "/rerank", {"query": "q", "documents": ["a", "b", "c"]})
    assert status == 200 and len(answer["results"]) == 3
