"""Growth: time and peak server memory for one rerank of 10 ... 10,000 documents.

The harness samples the server's VmRSS every few milliseconds while the load generator sends one
request, and reads VmHWM after it. Sizes go up, so on a fresh server VmHWM after each size is the
peak of everything so far: flat memory means it stops rising once a batch's working set is reached.
Time is judged on the server's CPU seconds per document (wall seconds are reported beside it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from bench.context import Context
from bench.corpus import documents, queries, rerank_body
from bench.cpu import process_cpu_s
from bench.driver import loadgen, write_spec
from bench.servers import Server, running, spawn_scorekit

MIB = 1024


@contextlib.contextmanager
def sampling(server: Server, period: float = 0.005) -> Iterator[list[int]]:
    """VmRSS samples (KiB) taken in a thread for as long as the block runs."""
    samples: list[int] = [server.status_kib("VmRSS")]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(period):
            samples.append(server.status_kib("VmRSS"))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def _measure(ctx: Context, server: Server) -> dict[str, Any]:
    warm = write_spec(ctx.work, "growth-warm", "/rerank", [rerank_body("warm up", documents(8, seed=31))])
    loadgen("single", server.port, "--spec", warm)
    baseline = server.status_kib("VmRSS")
    points = []
    for size in ctx.profile.growth_sizes:
        body = rerank_body(queries(1, seed=size)[0], documents(size, seed=size))
        spec = write_spec(ctx.work, f"growth-{size}", "/rerank", [body])
        idle = server.status_kib("VmRSS")
        cpu_before = process_cpu_s(server.pid)
        with sampling(server) as samples:
            answer = loadgen("single", server.port, "--spec", spec, "--timeout", 600, timeout=700)
        cpu = process_cpu_s(server.pid) - cpu_before
        if answer["status"] != 200:
            raise RuntimeError(f"growth {size}: status {answer['status']}")
        hwm = server.status_kib("VmHWM")
        points.append(
            {
                "documents": size,
                "seconds": answer["seconds"],
                "ms_per_document": answer["seconds"] * 1000 / size,
                "server_cpu_s": cpu,
                "cpu_ms_per_document": cpu * 1000 / size,
                "idle_rss_mib": idle / MIB,
                "peak_rss_mib": max(samples) / MIB,
                "peak_over_idle_mib": (max(samples) - idle) / MIB,
                "hwm_mib": hwm / MIB,
                "hwm_over_baseline_mib": (hwm - baseline) / MIB,
            }
        )
    last = points[-1]
    mid = points[-2] if len(points) > 1 else points[0]
    # Issue 12's memory figure: what each document past 1,000 adds to the peak, at 10,000 (the full profile's
    # two largest sizes; a smoke run's two largest stand in).
    low, high = _pair(points, 1000, 10_000)
    return {
        "baseline_rss_mib": baseline / MIB,
        "points": points,
        # Linear time: server CPU per document at the largest size over the next size down (1 is linear).
        "time_per_doc_ratio": last["cpu_ms_per_document"] / mid["cpu_ms_per_document"],
        "time_per_doc_ratio_wall": last["ms_per_document"] / mid["ms_per_document"],
        # Flat memory: the peak's growth over the warmed-up baseline, largest size over the next one down
        # (1 is flat, the size ratio is linear); growth under 1 MiB counts as 1 MiB.
        "memory_growth_ratio": last["hwm_over_baseline_mib"] / max(mid["hwm_over_baseline_mib"], 1.0),
        "kib_per_extra_document": 1024
        * (high["hwm_mib"] - low["hwm_mib"])
        / max(high["documents"] - low["documents"], 1),
        "kib_per_extra_document_between": [low["documents"], high["documents"]],
    }


def _pair(points: list[dict[str, Any]], low: int, high: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The points at ``low`` and ``high`` documents, or else the two largest sizes."""
    by_size = {point["documents"]: point for point in points}
    if low in by_size and high in by_size:
        return by_size[low], by_size[high]
    return points[-2] if len(points) > 1 else points[0], points[-1]


def run(ctx: Context) -> dict[str, Any]:
    if not ctx.profile.fresh_growth_server:
        return _measure(ctx, ctx.scorekit)
    server = spawn_scorekit("scorekit-growth", ctx.work)
    with running(server):
        return _measure(ctx, server)
