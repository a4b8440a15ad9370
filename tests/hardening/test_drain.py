"""A drain counts and waits for the requests admitted before it, never for the ones it refuses."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from scorekit.metrics import Metrics
from scorekit.settings import Settings
from tests.hardening.conftest import docs, error_of, running
from tests.hardening.process import log_lines, scorekit_serve, start_slow
from tests.live import Live

SMALL = {"query": "q", "documents": ["d"]}


def test_refused_requests_never_count_as_load(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []  # (status, scoring requests in flight) as each request ends
    observe = Metrics.observe_request

    def spy(self: Metrics, route: str, status: int, seconds: float) -> None:
        seen.append((status, app.load.routed))
        observe(self, route, status, seconds)

    monkeypatch.setattr(Metrics, "observe_request", spy)
    with running(Settings()) as (app, live):
        app.drain.begin()
        for _ in range(5):
            status, headers, raw = live.request("POST", "/rerank", SMALL, timeout=30)
            error_of(status, raw, 503)
            assert headers.get("connection") == "close"
        assert live.wait_load(0) == 0  # the last answer can arrive just before its request leaves the middleware
    # The router's observer runs before the request leaves the lifecycle: a refused request that had been
    # labelled as load would still count here.
    assert [routed for status, routed in seen if status == 503] == [0] * 5


def _flood(live: Live, stop: threading.Event, statuses: list[int]) -> None:
    while not stop.is_set():
        try:
            statuses.append(live.request("POST", "/rerank", SMALL, timeout=10)[0])
        except OSError:  # the listener closed: the process is shutting down
            return


def test_the_drain_ends_when_the_admitted_requests_finish_even_under_a_flood(tmp_path: Path) -> None:
    timeout = 300  # far beyond the test: only the admitted request's end may end the drain
    with scorekit_serve(tmp_path, "--shutdown-timeout", str(timeout)) as (proc, live, log):
        thread, slow = start_slow(live, docs(600, words=4))
        proc.send_signal(signal.SIGTERM)
        stop = threading.Event()
        statuses: list[int] = []
        flooders = [threading.Thread(target=_flood, args=(live, stop, statuses)) for _ in range(4)]
        for flooder in flooders:
            flooder.start()
        try:
            thread.join(120)
            assert slow.get("status") == 200, slow
            # The flood goes on; the process must still leave (it used to wait for a quiet moment).
            assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
            exited = time.monotonic()
        finally:
            stop.set()
            for flooder in flooders:
                flooder.join(30)
        assert statuses and set(statuses) == {503}, set(statuses)
        assert exited >= slow["done"]
        assert not log_lines(log, "still in flight with 503"), "the drain ended at its deadline, not when done"
