"""Efficiency: scorekit's items/s at each concurrency over the raw forward's items/s at its best batch size.

Two forms of the ratio, both on the same texts:

- wall: server items per second over raw-forward items per second. The ceiling is re-measured in
  this process right before and after every server window, at the sweep's best batch size, and each
  window is divided by the mean of its two neighbours, so slow drift on the machine cancels out.
- cpu: server items per CPU second of the server process over raw items per CPU second of this
  process. Other jobs on a shared machine stretch wall time but hardly change CPU time per item,
  so this is the form that stays put when the machine is busy (``other_cores`` says how busy).
"""

from __future__ import annotations

from typing import Any

from bench.context import Context
from bench.rawforward import Ceiling, Rate


def run(ctx: Context, ceiling: Ceiling) -> dict[str, Any]:
    p = ctx.profile
    sweep = ceiling.sweep(p.sweep_batch_sizes, p.sweep_seconds)
    best = max(sweep, key=lambda size: sweep[size].items_per_cpu_s)
    raw: list[Rate] = [ceiling.rate(best, p.sweep_seconds)]
    points: list[dict[str, Any]] = []
    for concurrency in p.concurrencies:
        window = ctx.closed(ctx.scorekit, ctx.rerank_spec, concurrency, metrics=True)
        raw.append(ceiling.rate(best, p.sweep_seconds))
        wall_ref = (raw[-2].items_per_s + raw[-1].items_per_s) / 2
        cpu_ref = (raw[-2].items_per_cpu_s + raw[-1].items_per_cpu_s) / 2
        items = window["metrics"]["batch_items"]
        per_cpu = items / max(window["cpu"]["server_cpu_s"], 1e-9)
        points.append(
            {
                "concurrency": concurrency,
                "server_items_per_s": window["server_items_per_s"],
                "server_items_per_cpu_s": per_cpu,
                "mean_batch": items / max(window["metrics"]["batches"], 1),
                "rps": window["rps"],
                "latency_ms": window["latency_ms"],
                "statuses": window["statuses"],
                "cpu": window["cpu"],
                "ceiling_items_per_s": wall_ref,
                "ceiling_items_per_cpu_s": cpu_ref,
                "ratio_wall": window["server_items_per_s"] / wall_ref,
                "ratio_cpu": per_cpu / cpu_ref,
            }
        )
    saturated = [point for point in points if point["concurrency"] >= 8] or points[-1:]
    return {
        "items_per_request": ctx.requests.items_per_request,
        "mean_tokens_per_item": ceiling.mean_tokens,
        "tokenize_items_per_s": ceiling.tokenize_items_per_s,
        "sweep": {str(size): rate.as_dict() for size, rate in sweep.items()},
        "best_batch_size": best,
        "ceiling": [rate.as_dict() for rate in raw],
        "points": points,
        "ratio_wall": min(point["ratio_wall"] for point in saturated),
        "ratio": min(point["ratio_cpu"] for point in saturated),
    }
