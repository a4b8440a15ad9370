"""Small PNGs for docs/benchmarks.md: throughput and latency against concurrency, and growth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # the backend is chosen first

_SIZE = (6.0, 3.4)
_DPI = 80


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI)
    plt.close(figure)
    return path


def throughput(out: Path, efficiency: dict[str, Any], batching: dict[str, Any]) -> Path:
    figure, axis = plt.subplots(figsize=_SIZE)
    sk = efficiency["points"]
    axis.plot([p["concurrency"] for p in sk], [p["server_items_per_s"] for p in sk], "o-", label="scorekit")
    naive = batching["naive_points"]
    axis.plot([p["concurrency"] for p in naive], [p["items_per_s"] for p in naive], "s--", label="naive")
    axis.plot(
        [p["concurrency"] for p in sk],
        [p["ceiling_items_per_s"] for p in sk],
        ":",
        color="grey",
        label=f"raw forward, batch {efficiency['best_batch_size']}",
    )
    axis.set_xscale("log", base=2)
    axis.set_xlabel("concurrent connections")
    axis.set_ylabel("model items / s")
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=8)
    axis.set_title("Throughput (MiniLM, 16 docs per /rerank)", fontsize=10)
    return _save(figure, out / "throughput.png")


def latency(out: Path, efficiency: dict[str, Any], batching: dict[str, Any]) -> Path:
    figure, axis = plt.subplots(figsize=_SIZE)
    for name, points, style in (
        ("scorekit", efficiency["points"], "-"),
        ("naive", batching["naive_points"], "--"),
    ):
        xs = [p["concurrency"] for p in points]
        for q, marker in (("p50", "o"), ("p99", "^")):
            axis.plot(xs, [p["latency_ms"][q] for p in points], style, marker=marker, label=f"{name} {q}")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("concurrent connections")
    axis.set_ylabel("latency (ms)")
    axis.legend(fontsize=8)
    axis.set_title("Latency percentiles per /rerank", fontsize=10)
    return _save(figure, out / "latency.png")


def growth(out: Path, result: dict[str, Any]) -> Path:
    figure, left = plt.subplots(figsize=_SIZE)
    points = result["points"]
    xs = [p["documents"] for p in points]
    left.plot(xs, [p["seconds"] for p in points], "o-", color="C0", label="time (s)")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("documents in one /rerank")
    left.set_ylabel("seconds", color="C0")
    right = left.twinx()
    right.plot(xs, [p["hwm_over_baseline_mib"] for p in points], "s--", color="C1", label="peak RSS over baseline")
    right.set_ylabel("peak RSS over baseline (MiB)", color="C1")
    left.set_title("Growth: one request of N documents", fontsize=10)
    return _save(figure, out / "growth.png")


def draw(out: Path, results: dict[str, Any]) -> list[Path]:
    drawn = []
    if "efficiency" in results and "batching" in results:
        drawn += [throughput(out, results["efficiency"], results["batching"])]
        drawn += [latency(out, results["efficiency"], results["batching"])]
    if "growth" in results:
        drawn.append(growth(out, results["growth"]))
    return drawn
