"""Batching gain: scorekit over the naive server (one forward per request), same model, same inputs.

Two forms: requests/s (wall), and server CPU seconds per request (naive over scorekit), which holds
still when other jobs share the machine. scorekit is measured again right after the naive server at
the target concurrency, and the gain uses the mean of that window and the efficiency run's. The same
comparison with 1-document requests shows where cross-request batching pays on a CPU.
"""

from __future__ import annotations

from typing import Any

from bench.context import Context
from bench.corpus import rerank_set
from bench.driver import write_spec
from bench.servers import Server


def _point(window: dict[str, Any], items_per_request: float) -> dict[str, Any]:
    completed = max(window["completed"], 1)
    return {
        "concurrency": window["concurrency"],
        "rps": window["rps"],
        "items_per_s": window["rps"] * items_per_request,
        "cpu_ms_per_request": 1000 * window["cpu"]["server_cpu_s"] / completed,
        "latency_ms": window["latency_ms"],
        "statuses": window["statuses"],
        "cpu": window["cpu"],
    }


def run(ctx: Context, naive: Server, efficiency: dict[str, Any]) -> dict[str, Any]:
    p = ctx.profile
    items = ctx.requests.items_per_request
    naive_points = [
        _point(ctx.closed(naive, ctx.rerank_spec, concurrency), items) for concurrency in p.naive_concurrencies
    ]
    target = p.batching_concurrency
    naive_at = next(point for point in naive_points if point["concurrency"] == target)
    again = _point(ctx.closed(ctx.scorekit, ctx.rerank_spec, target), items)
    earlier = next(point for point in efficiency["points"] if point["concurrency"] == target)
    earlier_cpu_ms = 1000 * items / earlier["server_items_per_cpu_s"]
    scorekit_rps = [earlier["rps"], again["rps"]]
    one_doc = _one_document_gain(ctx, naive, target)
    scorekit_cpu_ms = [earlier_cpu_ms, again["cpu_ms_per_request"]]
    return {
        "concurrency": target,
        "naive_points": naive_points,
        "scorekit_rps": scorekit_rps,
        "scorekit_cpu_ms_per_request": scorekit_cpu_ms,
        "naive_rps": naive_at["rps"],
        "naive_cpu_ms_per_request": naive_at["cpu_ms_per_request"],
        "gain_wall": (sum(scorekit_rps) / 2) / naive_at["rps"],
        "gain": naive_at["cpu_ms_per_request"] / (sum(scorekit_cpu_ms) / 2),
        "one_document": one_doc,
    }


def _one_document_gain(ctx: Context, naive: Server, concurrency: int) -> dict[str, Any]:
    """The same comparison with 1-document reranks, where each request alone is a batch of two."""
    small = rerank_set(64, 1, seed=5)
    spec = write_spec(ctx.work, "rerank-1doc", "/rerank", small.bodies)
    window = min(ctx.profile.window_s, 5.0)
    sk = _point(ctx.closed(ctx.scorekit, spec, concurrency, window=window), small.items_per_request)
    nv = _point(ctx.closed(naive, spec, concurrency, window=window), small.items_per_request)
    return {
        "scorekit": sk,
        "naive": nv,
        "gain_wall": sk["rps"] / nv["rps"],
        "gain": nv["cpu_ms_per_request"] / sk["cpu_ms_per_request"],
    }
