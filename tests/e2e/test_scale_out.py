"""Two `scorekit serve` replicas as separate processes: each /load counts only its own requests in flight,
which is what a load balancer that routes by /load relies on; and SIGTERM drains a replica.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.live import Live, free_port, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 180.0  # loading MiniLM on a busy 2-core machine
SLOW = ["--max-batch-size", "16", "--max-batch-tokens", "4096"]  # so a large rerank spans many batches


@dataclass
class Replica:
    live: Live
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def healthy(self) -> bool:
        try:
            return self.live.request("GET", "/health", timeout=2)[0] == 200
        except OSError:
            return False


def start(log: Path, *args: str) -> Replica:
    port = free_port()
    command = [sys.executable, "-m", "scorekit.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return Replica(Live("127.0.0.1", port), process, log)


def wait_healthy(*replicas: Replica) -> None:
    for replica in replicas:

        def up_or_dead(replica: Replica = replica) -> bool:
            return replica.healthy() or replica.process.poll() is not None

        up = wait_for(up_or_dead, timeout=STARTUP_TIMEOUT, interval=0.2)
        assert up and replica.process.poll() is None, f"replica did not become healthy:\n{replica.output()}"


def stop(replica: Replica) -> None:
    """SIGTERM (drain, then exit); a second SIGTERM and finally SIGKILL if it does not go."""
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        if replica.process.poll() is not None:
            return
        replica.process.send_signal(sig)
        try:
            replica.process.wait(15)
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def replicas(tmp_path: Path, *argv: list[str]) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for i, args in enumerate(argv):
            started.append(start(tmp_path / f"replica-{i}.log", *args))
        wait_healthy(*started)
        yield started
    finally:
        for replica in started:
            stop(replica)


def batches_run(live: Live) -> float:
    """``scorekit_batch_size_count`` from /metrics: how many model batches this replica has run."""
    _, _, raw = live.request("GET", "/metrics")
    for line in raw.decode().splitlines():
        if line.startswith("scorekit_batch_size_count"):
            return float(line.split()[-1])
    return 0.0


def docs(n: int) -> list[str]:
    return [f"document number {i} talks about topic {i % 17} in some detail" for i in range(n)]


def big_reranks(live: Live, n: int, size: int) -> tuple[list[threading.Thread], list[int]]:
    """Start ``n`` large reranks on ``live`` in threads; the list fills with their statuses."""
    statuses: list[int] = []
    payload = {"query": "topic 3", "documents": docs(size), "top_n": 3}

    def one() -> None:
        statuses.append(live.json("POST", "/rerank", payload, timeout=120)[0])

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    return threads, statuses


def test_each_replica_reports_only_its_own_load(tmp_path: Path) -> None:
    n = 3
    with replicas(tmp_path, SLOW, []) as (a, b):
        assert a.live.load() == 0 and b.live.load() == 0
        threads, statuses = big_reranks(a.live, n, 600)
        samples: list[tuple[int, int]] = []
        deadline = time.monotonic() + 120
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            samples.append((a.live.load(), b.live.load()))
            time.sleep(0.05)
        for thread in threads:
            thread.join(5)
        assert statuses == [200] * n, f"{statuses}\n{a.output()}"
        busy = [s for s in samples if s[0] > 0]
        assert busy, f"never saw replica A busy; samples: {samples}"
        assert max(s[0] for s in samples) <= n, samples
        assert all(load_b == 0 for _, load_b in samples), samples
        # Once the reranks are answered: both idle. A decrements just after its last response went out.
        assert a.live.wait_load(0) == 0 and b.live.wait_load(0) == 0
        # Load shows up on the replica that gets the work, whichever it is.
        threads, statuses = big_reranks(b.live, 1, 600)
        assert wait_for(lambda: b.live.load() == 1, timeout=30), "B never reported its request"
        assert a.live.load() == 0
        threads[0].join(120)
        assert statuses == [200] and b.live.wait_load(0) == 0


def test_sigterm_drains_a_replica(tmp_path: Path) -> None:
    """New scoring requests and /health get 503 while the in-flight rerank finishes; then the process exits 0."""
    # A deadline far past the rerank's few seconds: reaching it would answer the rerank 503, so a 200 below
    # proves the drain ended because nothing was left in flight, with no clock in the test.
    with replicas(tmp_path, [*SLOW, "--shutdown-timeout", "300"]) as (a,):
        threads, statuses = big_reranks(a.live, 1, 800)
        # In flight on the model, not only routed: /load counts a request from routing on, but one whose
        # body is still being read or decoded when the drain begins is answered 503 (it was not admitted).
        assert wait_for(lambda: batches_run(a.live) >= 2, timeout=30), "the rerank never reached the model"
        assert a.live.load() == 1
        a.process.send_signal(signal.SIGTERM)
        status, headers, raw = a.live.request("POST", "/rerank", {"query": "q", "documents": ["d"]})
        assert status == 503 and headers.get("retry-after") == "1", raw
        assert b"shutting down" in raw
        health: Any = a.live.request("GET", "/health")
        assert health[0] == 503, health
        threads[0].join(120)
        assert statuses == [200], "the in-flight request did not finish during the drain"
        assert a.process.wait(30) == 0, a.output()
