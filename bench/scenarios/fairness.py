"""Fairness: p99 latency of 1-document reranks while a huge rerank runs, over their p99 alone.

Probes run one at a time on their own connection: alone, then from the huge request's first batch
until it completes (or ``fairness_probe_s`` passes and its client hangs up), then alone again; the
alone p99 is the lower of the two alone phases. Each loaded probe also records how many model batches
ran while it waited, which says why it waited (a ratio of latencies alone cannot).

What the probes' own CPU leaves the huge request: each probe costs the server the CPU it costs alone (a closed
loop of probes alone, measured at the end), and the huge request can have at most the cores that leaves, over
the cores it kept busy alone (``pace_room``, for the probes answered). A back-to-back probe answered within 3x
of its p99 alone comes at least once per 3 such p99s (``pace_room_at_3x``). Both count a probe in a batch of its
own at its CPU alone. Beside the huge request's batch it can cost that batch more (threads contend for the
cores); riding inside it, less (two more rows of a batch). Below 0.9, probes that fast in batches of their own
cannot leave the huge request 0.9 of its pace on this machine; above it, the gap to the pace measured is what
running them beside it cost. ``probed_client_cores`` is the load generator's own CPU meanwhile, on the same
cores: what the probes' client takes from the machine rather than the server.

With ``fairness_small_batch_tokens`` set, the same is measured on a second server started with a small
``--max-batch-tokens``, to show what the batch size buys in latency and costs in throughput.

Two keys (``two_keys``): a server started with two API keys (each weight 1); one key floods it with the batching
scenario's 16-document reranks from ``fairness_flood_concurrency`` connections in closed loops, and the other's
1-document probes are timed beside the flood against their time alone. As a control, the same probes are then
sent with the flooding key's own credentials, so they share its fair share instead of having one of their own. The
flood comes from a client process of its own, as another client's would; then, side by side, from the probes' own
client process (``flood_in_process``), the earlier way, which also times the probes' client answering the flood.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.corpus import documents, queries, rerank_body
from bench.driver import loadgen, write_spec
from bench.servers import Server, running, spawn_scorekit

# The two keys of the two-key case, as its server's --api-key-file names them.
QUIET_KEY, FLOOD_KEY = "bench-quiet-5c1e", "bench-flood-9d7a"


def _measure(ctx: Context, server: Server, small: Path, big: Path) -> dict[str, Any]:
    p = ctx.profile
    args = ["--small", small, "--big", big, "--alone", p.fairness_alone_probes, "--probe-seconds", p.fairness_probe_s]
    args += ["--big-alone-s", p.fairness_big_alone_s, "--pid", server.pid]
    result = loadgen("fairness", server.port, *args)
    # The lower of the two alone phases: other jobs on the machine only ever add to a latency.
    alone = {q: min(result["alone_ms"][q], result["alone_after_ms"][q]) for q in ("p50", "p99")}
    result["ratio_p99"] = result["loaded_ms"]["p99"] / alone["p99"]
    result["ratio_p50"] = result["loaded_ms"]["p50"] / alone["p50"]
    # What serving the probes cost the huge request (1.0: nothing).
    result["big_pace_ratio"] = result["big_items_per_s_probed"] / max(result["big_items_per_s_alone"], 1e-9)
    result["probe_cost"] = cost = _probe_cost(ctx, server, small)
    cores, big = len(os.sched_getaffinity(server.pid)), max(result["big_alone_cores"], 1e-9)
    probes_per_s = {
        "pace_room": result["loaded_ms"]["n"] / max(result["probed_s"], 1e-9),
        "pace_room_at_3x": 1000 / (3 * alone["p99"]),
    }
    for key, rate in probes_per_s.items():
        result[key] = min(1.0, (cores - rate * cost["server_cpu_s"]) / big)
    result["cores"] = cores
    return result


def _probe_cost(ctx: Context, server: Server, small: Path) -> dict[str, float]:
    """The server CPU one probe costs alone, from a closed loop of probes on one connection."""
    window = ctx.closed(server, small, 1, window=ctx.profile.fairness_probe_cost_s)
    return {
        "server_cpu_s": window["cpu"]["server_cpu_s"] / max(window["completed"], 1),
        "cores": window["cpu"]["server_cpu_s"] / max(window["window_s"], 1e-9),
    }


def run(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    small = write_spec(ctx.work, "fair-small", "/rerank", [rerank_body(queries(1, seed=21)[0], documents(1, seed=21))])
    big = write_spec(
        ctx.work, "fair-big", "/rerank", [rerank_body(queries(1, seed=22)[0], documents(p.fairness_big_docs, 22))]
    )
    result: dict[str, Any] = {"big_documents": p.fairness_big_docs, "default": _measure(ctx, ctx.scorekit, small, big)}
    result["ratio"] = result["default"]["ratio_p99"]
    if p.fairness_small_batch_tokens is not None:
        tokens = p.fairness_small_batch_tokens
        server = spawn_scorekit("scorekit-small-batches", ctx.work, ["--max-batch-tokens", str(tokens)])
        with running(server):
            small_batches = {"max_batch_tokens": tokens, **_measure(ctx, server, small, big)}
            # What the small batches cost: throughput of both servers back to back, same load.
            rates = [_throughput(ctx, each) for each in (ctx.scorekit, server, ctx.scorekit)]
        small_batches["items_per_cpu_s"] = rates[1]
        small_batches["default_items_per_cpu_s"] = (rates[0] + rates[2]) / 2
        small_batches["throughput_ratio"] = rates[1] / small_batches["default_items_per_cpu_s"]
        result["small_batches"] = small_batches
    result["two_keys"] = _two_keys(ctx, small)
    return result


def _two_keys(ctx: Context, small: Path) -> dict[str, Any]:
    """The quiet key's 1-document p99 beside the other key's flood, over its p99 alone (the lower of the two alone
    phases), and the same for the control sent with the flooding key."""
    p = ctx.profile
    keys = ctx.work / "two-keys"
    keys.write_text(f"{QUIET_KEY} name=quiet\n{FLOOD_KEY} name=flood\n")
    server = spawn_scorekit("scorekit-two-keys", ctx.work, [*p.scorekit_args, "--api-key-file", str(keys)])
    args: list[object] = ["--small", small, "--flood", ctx.rerank_spec, "--quiet-key", QUIET_KEY]
    args += [
        "--flood-key",
        FLOOD_KEY,
        "--concurrency",
        p.fairness_flood_concurrency,
        "--alone",
        p.fairness_two_keys_alone_probes,
    ]
    args += ["--probe-seconds", p.fairness_probe_s]
    with running(server):
        result = loadgen("two_keys", server.port, *args)
        if p.fairness_flood_in_process:
            # The earlier way, side by side: the flood from the probes' own client process, whose event loop then
            # answers 32 connections between a probe's request and its timing.
            result["flood_in_process"] = _ratios(loadgen("two_keys", server.port, *args, "--flood-in-process"))
    result["flood_concurrency"] = p.fairness_flood_concurrency
    return _ratios(result)


def _ratios(result: dict[str, Any]) -> dict[str, Any]:
    """Each loaded phase's p99 and p50 over those of the quiet key alone: of its probes alone before and after the
    flood, pooled. (The lower of the two phases' own, which the figure once took, is kept beside it as
    ``*_ratio_p99_lower_alone``: the lower of two estimates from a hundred-odd probes each is biased low, the more so
    the fewer the probes.)"""
    pooled = result["alone_pooled_ms"]
    lower = {q: min(result["alone_ms"][q], result["alone_after_ms"][q]) for q in ("p50", "p99")}
    for phase in ("loaded", "same_key"):
        result[f"{phase}_ratio_p99"] = result[f"{phase}_ms"]["p99"] / pooled["p99"]
        result[f"{phase}_ratio_p50"] = result[f"{phase}_ms"]["p50"] / pooled["p50"]
        result[f"{phase}_ratio_p99_lower_alone"] = result[f"{phase}_ms"]["p99"] / lower["p99"]
    return result


def _throughput(ctx: Context, server: Server) -> float:
    """Model items per server CPU second at the batching concurrency (16-document reranks)."""
    window = ctx.closed(server, ctx.rerank_spec, ctx.profile.batching_concurrency, metrics=True, window=5.0)
    return float(window["metrics"]["batch_items"] / max(window["cpu"]["server_cpu_s"], 1e-9))
