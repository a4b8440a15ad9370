"""Wasted work on disconnect: items the model ran after the client of a big rerank hung up.

The load generator scrapes /metrics, closes the socket a millisecond later, and waits until the
queue is empty and no batch ran for two batch periods. Everything the model ran after the scrape is
waste; one batch (the one in flight, which is never interrupted) is the expected minimum.

The figure is the number of batches that ran after the scrape (the /metrics batch counter). The items they held,
over the mean batch before the close, are kept beside it, but that is not a batch count: the batches before the
close are shorter while the engine's cost fit settles, so one whole batch after it can hold more items than their
mean (1.01-1.23 with exactly one batch after the close in every trial, docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.context import Context
from bench.corpus import documents, queries, rerank_body
from bench.driver import loadgen, write_spec


def run(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    body = rerank_body(queries(1, seed=11)[0], documents(p.disconnect_docs, seed=11))
    spec = write_spec(ctx.work, "disconnect", "/rerank", [body])
    trials = []
    for _ in range(p.disconnect_trials):
        trial = loadgen("abort", ctx.scorekit.port, "--spec", spec, "--after-batches", p.disconnect_after_batches)
        before, after = trial["before_close"], trial["after_close"]
        trial["batch_items"] = before["batch_items"] / max(before["batches"], 1)
        trial["wasted_items"] = after["batch_items"]
        trial["wasted_batches"] = after["batches"]
        trial["wasted_items_per_batch"] = after["batch_items"] / trial["batch_items"]
        trial["accounted_items"] = before["batch_items"] + after["batch_items"] + after["dropped"]
        trials.append(trial)
    return {
        "documents": p.disconnect_docs,
        "items": p.disconnect_docs + 1,
        "trials": trials,
        "wasted_items": statistics.median(t["wasted_items"] for t in trials),
        "batch_items": statistics.median(t["batch_items"] for t in trials),
        "wasted_batches": statistics.median(t["wasted_batches"] for t in trials),
        "wasted_items_per_batch": statistics.median(t["wasted_items_per_batch"] for t in trials),
    }
