"""Faults inside the model: a failing batch fails only its own requests; a dead worker turns /health 503.

The faults are injected by replacing ``forward`` on the loaded backend (``app.engine.backend``), which
the worker thread calls for every batch. Batches are small (4 items), and each request is a 1:1
/score with texts of its own (two items on the bi-encoder), so sixteen concurrent requests spread over
many batches, and the test knows exactly which requests had an item in the failing one.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from scorekit.app import ScorekitApp
from scorekit.models.base import Encoded
from scorekit.settings import EngineConfig, Settings
from tests.hardening.conftest import error_of, json_head, read_response, running
from tests.live import Live, wait_for

REQUESTS = 16
Forward = Callable[[Sequence[Encoded]], list[torch.Tensor]]


def _pair(i: int) -> dict[str, str]:
    return {"queries": f"question number {i} about subject {i * 3}", "documents": f"answer {i} on subject {i * 3}"}


@pytest.fixture
def small() -> Iterator[tuple[ScorekitApp, Live]]:
    with running(Settings.for_model(engine=EngineConfig(max_batch_size=4))) as started:
        yield started


def _post(live: Live, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One /score over its own socket, closed on the way out even on a timeout (so the server sees the
    client leave, and a hung request cannot outlive the test)."""
    data = json.dumps(body).encode()
    with socket.create_connection((live.host, live.port), timeout=timeout) as sock:
        sock.sendall(json_head("/score", data) + data)
        return read_response(sock)


def _fire(live: Live, bodies: list[dict[str, Any]], timeout: float = 60) -> list[tuple[int, bytes]]:
    barrier = threading.Barrier(len(bodies))

    def one(body: dict[str, Any]) -> tuple[int, bytes]:
        barrier.wait()
        status, _, raw = _post(live, body, timeout)
        return status, raw

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def test_a_failing_batch_fails_only_its_requests(small: tuple[ScorekitApp, Live], monkeypatch: Any) -> None:
    app, live = small
    assert app.engine is not None
    backend: Any = app.engine.backend
    bodies = [_pair(i) for i in range(REQUESTS)]
    alone = [live.json("POST", "/score", body)[1]["data"][0]["score"] for body in bodies]
    ids_of = [
        {tuple(e.input_ids) for e in backend.encode_texts([b["queries"], b["documents"]], None, None)} for b in bodies
    ]

    real: Forward = backend.forward
    calls = 0
    failed: list[set[tuple[int, ...]]] = []
    lock = threading.Lock()

    def flaky(batch: Sequence[Encoded]) -> list[torch.Tensor]:
        nonlocal calls
        with lock:
            calls += 1
            fail = calls == 3
        if fail:
            failed.append({tuple(item.input_ids) for item in batch})
            # A message with an address and a path: neither may reach the client.
            raise RuntimeError("CUDA error at 0x7f3a2b1c0d00 in /opt/secret/model.py")
        return real(batch)

    monkeypatch.setattr(backend, "forward", flaky)
    results = _fire(live, bodies)
    monkeypatch.setattr(backend, "forward", real)

    assert len(failed) == 1
    in_failed_batch = {i for i in range(REQUESTS) if ids_of[i] & failed[0]}
    assert in_failed_batch and len(in_failed_batch) < REQUESTS
    for i, (status, raw) in enumerate(results):
        if i in in_failed_batch:
            error = error_of(status, raw, 500)
            assert "The model failed" in error["message"]
        else:
            assert status == 200, (i, raw)
            assert math.isclose(json.loads(raw)["data"][0]["score"], alone[i], abs_tol=1e-5)
    assert app.engine.snapshot().worker.failed_batches == 1
    # The server keeps serving.
    assert live.request("GET", "/health")[0] == 200
    assert live.json("POST", "/score", bodies[0])[1]["data"][0]["score"] == pytest.approx(alone[0], abs=1e-5)
    assert live.wait_load(0) == 0


def _kill_worker_on_first_batch(app: ScorekitApp, monkeypatch: Any) -> threading.Event:
    assert app.engine is not None
    backend: Any = app.engine.backend
    entered = threading.Event()

    def fatal(batch: Sequence[Encoded]) -> list[torch.Tensor]:
        entered.set()
        raise SystemExit("the model process is going away")

    monkeypatch.setattr(backend, "forward", fatal)
    return entered


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_worker_makes_health_503_and_is_logged(
    small: tuple[ScorekitApp, Live], monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app, live = small
    assert app.engine is not None
    assert live.request("GET", "/health")[0] == 200
    caplog.set_level(logging.CRITICAL, logger="scorekit.worker")
    _kill_worker_on_first_batch(app, monkeypatch)
    status, _, raw = live.request("POST", "/score", _pair(0), timeout=10)  # its batch killed the worker
    assert "worker died" in error_of(status, raw, 500)["message"]
    engine = app.engine
    assert wait_for(lambda: not engine.health.ready, timeout=5)
    assert isinstance(engine.health.death, SystemExit)

    status, _, raw = live.request("GET", "/health")
    error = error_of(status, raw, 503)
    assert "worker died" in error["message"] and "SystemExit" in error["message"]
    records = [r for r in caplog.records if r.name == "scorekit.worker" and r.levelno == logging.CRITICAL]
    assert records and "died" in records[0].getMessage() and "SystemExit" in records[0].getMessage()
    # New scoring requests are refused at once, not queued for a worker that is gone.
    status, headers, raw = live.request("POST", "/score", _pair(1), timeout=10)
    error_of(status, raw, 503)
    assert headers.get("retry-after") == "1"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_requests_waiting_on_a_dead_worker_do_not_hang(small: tuple[ScorekitApp, Live], monkeypatch: Any) -> None:
    app, live = small
    _kill_worker_on_first_batch(app, monkeypatch)
    # Six 2-item requests: the first batch (4 items) dies with the worker, the rest are still queued.
    bodies = [_pair(i) for i in range(6)]
    try:
        results = _fire(live, bodies, timeout=3)
    except TimeoutError as exc:
        pytest.fail(f"a request waiting on the dead worker hung: {exc!r}")
    for status, raw in results:
        assert status in (500, 503)
        error_of(status, raw, status)
