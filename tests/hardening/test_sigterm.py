"""SIGTERM on a real `scorekit serve` process drains: the request in flight finishes, new ones get 503 on
the still-open listener, and the process exits 0 within its shutdown timeout; a request that outlives
the timeout is cut off, and the process still exits within it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.hardening.conftest import docs, error_of, scrape
from tests.live import Live, free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = 600


@contextlib.contextmanager
def _scorekit_serve(tmp_path: Path, shutdown_timeout: int) -> Iterator[tuple[subprocess.Popen[bytes], Live, Path]]:
    """``python -m scorekit.cli serve`` from this venv, healthy; killed if a test leaves it running."""
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "scorekit.cli", "serve", "--port", str(port)]
    command += ["--shutdown-timeout", str(shutdown_timeout), "--max-batch-size", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    live = Live("127.0.0.1", port)
    try:
        _until(lambda: _healthy(live, proc, log), 120, "scorekit serve did not become healthy")
        yield proc, live, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
            raise AssertionError(f"scorekit serve was still running:\n{log.read_text()[-3000:]}")


def _healthy(live: Live, proc: subprocess.Popen[bytes], log: Path) -> bool:
    assert proc.poll() is None, f"scorekit serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
    try:
        return live.request("GET", "/health", timeout=2)[0] == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def _queued(live: Live) -> float:
    return scrape(live).get(("scorekit_queue_depth", ()), 0.0)


def _start_slow(live: Live, documents: list[str]) -> tuple[threading.Thread, dict[str, Any]]:
    """A large /rerank in a thread; returns once its items are queued for the model (counting as load is
    not enough: a request still reading its body when the drain starts is refused with a 503)."""
    slow: dict[str, Any] = {}

    def in_flight() -> None:
        body = {"query": "topic 3 in some detail", "documents": documents, "return_documents": False}
        try:
            slow["status"], slow["headers"], raw = live.request("POST", "/rerank", body, timeout=60)
            slow["body"] = json.loads(raw) if slow["headers"].get("content-type") == "application/json" else raw
        except (http.client.HTTPException, OSError) as exc:  # URLError and resets are OSErrors
            slow["error"] = exc
        slow["done"] = time.monotonic()

    thread = threading.Thread(target=in_flight)
    thread.start()
    _until(lambda: _queued(live) > 0, 30, "the slow request never reached the model")
    return thread, slow


def test_sigterm_drains_then_exits_0(tmp_path: Path) -> None:
    timeout = 20
    with _scorekit_serve(tmp_path, timeout) as (proc, live, log):
        # Long enough to observe the drain on a busy 2-core machine, well short of the timeout.
        thread, slow = _start_slow(live, docs(DOCS, words=4))
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _until(lambda: live.request("GET", "/health", timeout=5)[0] == 503, 5, "/health did not turn 503")
        status, headers, raw = live.request("POST", "/rerank", {"query": "q", "documents": ["d"]}, timeout=10)
        refused = time.monotonic()
        error = error_of(status, raw, 503)
        assert "shutting down" in error["message"] and headers.get("retry-after") == "1"

        thread.join(60)
        assert slow.get("status") == 200, slow
        assert len(slow["body"]["results"]) == DOCS
        assert slow["done"] > refused, "the slow request finished before draining could be observed"
        assert proc.wait(timeout=timeout + 10) == 0, log.read_text()[-3000:]
        assert time.monotonic() - signalled < timeout
        assert "draining" in log.read_text()


def test_sigterm_cuts_off_a_request_that_outlives_the_timeout(tmp_path: Path) -> None:
    timeout = 3
    with _scorekit_serve(tmp_path, timeout) as (proc, live, log):
        thread, slow = _start_slow(live, docs(3000, words=12))
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert proc.wait(timeout=timeout + 10) == 0, log.read_text()[-3000:]
        exited = time.monotonic() - signalled
        thread.join(10)
        # Cut off: uvicorn cancels the request's task and answers its own plain-text 500 (not the error
        # shape; see the report), or the connection just closes.
        assert "error" in slow or slow["status"] == 500, f"the request outlived the {timeout} s timeout: {slow}"
        # One timeout in all: the drain and uvicorn's own graceful wait share it (they used to add up to two),
        # plus the lifespan's shutdown and the interpreter's exit.
        assert exited < timeout + 2, exited
