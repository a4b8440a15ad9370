"""A real ``scorekit serve`` process for the tests of what only a process has: signals, descriptors, logs.

``python -m scorekit.cli serve`` runs from this venv on a free loopback port with its output in a log
file; ``open_files`` sets its RLIMIT_NOFILE (soft, hard) before it starts, so a test can exhaust its
descriptors with a few dozen sockets instead of thousands.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.hardening.conftest import scrape
from tests.live import Live, free_port

ROOT = Path(__file__).resolve().parents[2]
_LIMIT_THEN_EXEC = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@contextlib.contextmanager
def scorekit_serve(
    tmp_path: Path, *flags: str, open_files: tuple[int, int] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Live, Path]]:
    """The process, healthy; killed (and the test failed) if the test leaves it running."""
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "scorekit.cli", "serve", "--port", str(port), "--max-batch-size", "8", *flags]
    if open_files is not None:  # set in a tiny Python that then execs the server (no preexec_fn: threads)
        command[1:1] = ["-c", _LIMIT_THEN_EXEC % open_files]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    live = Live("127.0.0.1", port)
    try:
        until(lambda: _healthy(live, proc, log), 120, "scorekit serve did not become healthy")
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


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def queued(live: Live) -> float:
    """Items queued for every model."""
    return sum(value for (name, _), value in scrape(live).items() if name == "scorekit_queue_depth")


def start_slow(live: Live, documents: list[str]) -> tuple[threading.Thread, dict[str, Any]]:
    """A large /rerank in a thread; returns once its items are queued for the model (counting as load is
    not enough: a request still reading its body when the drain starts is refused with a 503).

    The result dict gets ``status``, ``headers``, ``raw`` and ``body`` (when JSON), or ``error``, and ``done``
    (``time.monotonic()`` when the answer or the error came)."""
    slow: dict[str, Any] = {}

    def in_flight() -> None:
        body = {"query": "topic 3 in some detail", "documents": documents, "return_documents": False}
        try:
            slow["status"], slow["headers"], slow["raw"] = live.request("POST", "/rerank", body, timeout=120)
            if slow["headers"].get("content-type") == "application/json":
                slow["body"] = json.loads(slow["raw"])
        except (http.client.HTTPException, OSError) as exc:  # URLError and resets are OSErrors
            slow["error"] = exc
        slow["done"] = time.monotonic()

    thread = threading.Thread(target=in_flight)
    thread.start()
    until(lambda: queued(live) > 0, 30, "the slow request never reached the model")
    return thread, slow


def log_lines(log: Path, text: str) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if text in line]
