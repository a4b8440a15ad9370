"""LLM reranker: the server's items per CPU second over a raw forward of the same prompts, what running a
request's shared prompt prefix once saves, and what keeping the template head's cache across requests saves.

The model is a random Qwen3 causal LM of bench size (4 layers, width 256, 16 heads; the smoke run's is tiny)
with a byte-level BPE tokenizer trained on the corpus's words, served with the Qwen3-Reranker preset (a
~100-token system prompt and instruction before each document). Random weights score nonsense, but they
cost what trained ones do.

- efficiency: ``scorekit serve`` under /rerank requests (one query, 16 documents) at concurrency 8, server
  items per server CPU second, over the backend's own ``forward`` on the same prompts in this process at its
  best batch (1, 2, 4 or 8 requests' prompts in the full run), in items per CPU second of this process.
- shared prefix: one request's prompts (1 x 16 and 1 x 128 documents in the full run) forwarded with the
  prefix marked (it runs once, its key/value cache reused) and without (every prompt whole), CPU seconds
  without over with; both with no head kept, as before there was one.
- head cache: one request of 1 x 16 documents, and 8 requests of 1 x 8 in one batch, forwarded with the
  template head's kept key/value cache and without (no head: each request's prefix runs whole, the head
  included, all the batch's prefixes in one forward), CPU seconds without over with.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.corpus import documents, queries, rerank_body
from bench.cpu import Reading
from bench.driver import write_spec
from bench.servers import running, spawn_scorekit
from scorekit.models import LLMRerankerBackend, load_backend
from scorekit.models.base import Encoded, no_checkpoint
from scorekit.tasks import PairOptions
from tests.tiny_models import build_qwen3_reranker

DOCS_PER_REQUEST = 16
REQUESTS = 32
CONCURRENCY = 8
QUERIES = queries(8, seed=5)  # the head cache's requests: one of 1 x 16, and 8 of 1 x 8 in one batch
HEAD_REPEATS = 4  # forwards per timing: a 1 x 16 forward of the bench model is ~50 ms of CPU


def build_model(folder: Path, width: int, layers: int) -> Path:
    """The random Qwen3 reranker (the same weights on every run)."""
    corpus = documents(512) + queries(64)
    return build_qwen3_reranker(
        folder, hidden_size=width, layers=layers, corpus=corpus, max_length=1024, vocab_size=2000
    )


def run(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    folder = build_model(ctx.work / "bench-qwen3-reranker", *p.llm_model)
    pool = documents(max(4 * DOCS_PER_REQUEST, 512), seed=3)
    bodies = [
        rerank_body(query, pool[(i * DOCS_PER_REQUEST) % len(pool) :][:DOCS_PER_REQUEST])
        for i, query in enumerate(queries(REQUESTS, seed=4))
    ]
    spec = write_spec(ctx.work, "llm-rerank", "/rerank", bodies)
    backend = load_backend(str(folder), kind="llm-reranker")
    assert isinstance(backend, LLMRerankerBackend)
    prompts = [_encode(backend, str(body["query"]), list(body["documents"])) for body in bodies]  # type: ignore[arg-type]
    # Before the server starts: a server loading its model beside the raw forward kept about one core busy, and
    # the forward's CPU per item measured then was ~16% below the same batch's on a quiet machine (raw_after).
    raw = {k: _raw_rate(backend, prompts, k, p.sweep_seconds) for k in p.llm_raw_batches}
    server = spawn_scorekit("llm-reranker", ctx.work, ("--model", str(folder), "--model-kind", "llm-reranker"))
    with running(server):
        window = ctx.closed(server, spec, CONCURRENCY, metrics=True)
    raw_after = _raw_rate(backend, prompts, max(raw, key=lambda k: raw[k]["items_per_cpu_s"]), p.sweep_seconds)
    best = max(max(rate["items_per_cpu_s"] for rate in raw.values()), raw_after["items_per_cpu_s"])
    items = window["metrics"]["batch_items"]
    per_cpu = items / max(window["cpu"]["server_cpu_s"], 1e-9)
    small, large = p.llm_prefix_sizes
    with _no_head(backend):
        prefix = {str(n): _prefix_speedup(backend, pool, n) for n in (small, large)}
    eights = [_encode(backend, query, pool[8 * i : 8 * (i + 1)]) for i, query in enumerate(QUERIES)]
    head = {
        "one": _head_speedup(backend, [_encode(backend, QUERIES[0], pool[:DOCS_PER_REQUEST])]),
        "batch": _head_speedup(backend, eights),
    }
    return {
        "docs_per_request": DOCS_PER_REQUEST,
        "concurrency": CONCURRENCY,
        "mean_prompt_tokens": sum(item.cost for request in prompts for item in request) / (REQUESTS * DOCS_PER_REQUEST),
        "raw": {str(k): rate for k, rate in raw.items()},
        "raw_after": raw_after,
        "server_items_per_cpu_s": per_cpu,
        "server_items_per_s": window["server_items_per_s"],
        "mean_batch": items / max(window["metrics"]["batches"], 1),
        "latency_ms": window["latency_ms"],
        "statuses": window["statuses"],
        "ratio": per_cpu / best,
        "prefix": prefix,
        "prefix_speedup_small": prefix[str(small)]["speedup"],
        "prefix_speedup_large": prefix[str(large)]["speedup"],
        "head": head,
        "head_speedup_one": head["one"]["speedup"],
        "head_speedup_batch": head["batch"]["speedup"],
    }


def _encode(backend: LLMRerankerBackend, query: str, docs: list[str]) -> list[Encoded]:
    return backend.plan_pairs([query], docs, PairOptions()).encode(no_checkpoint).inputs


def _raw_rate(
    backend: LLMRerankerBackend, prompts: list[list[Encoded]], requests: int, seconds: float
) -> dict[str, float]:
    """Forward ``requests`` requests' prompts per batch, round-robin, for at least ``seconds``."""
    batches = [
        [item for request in prompts[i : i + requests] for item in request] for i in range(0, len(prompts), requests)
    ]
    backend.forward(batches[0])  # warm
    items = count = 0
    start = Reading.take(None)
    while count < 2 or Reading.take(None).wall - start.wall < seconds:
        batch = batches[count % len(batches)]
        backend.forward(batch)
        items += len(batch)
        count += 1
    cpu = Reading.take(None).minus(start)
    return {
        "items_per_s": items / cpu["wall_s"],
        "items_per_cpu_s": items / cpu["own_cpu_s"],
        "other_cores": cpu["other_cores"],
    }


def _prefix_speedup(backend: LLMRerankerBackend, pool: list[str], n: int) -> dict[str, float]:
    """CPU seconds of one 1 x n request's forwards without the shared prefix over with it (batches of 32,
    best of 3 each, alternating)."""
    shared = _encode(backend, "which document answers the query best", [pool[i % len(pool)] for i in range(n)])
    whole = [Encoded(item.input_ids, label_token_ids=item.label_token_ids) for item in shared]
    times: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(3):
        for name, items in (("with", shared), ("without", whole)):
            start = Reading.take(None)
            for i in range(0, n, 32):
                backend.forward(items[i : i + 32])
            times[name].append(Reading.take(None).minus(start)["own_cpu_s"])
    with_s, without_s = min(times["with"]), min(times["without"])
    prefix = shared[0].prefix
    return {
        "with_cpu_s": with_s,
        "without_cpu_s": without_s,
        "speedup": without_s / with_s,
        "prefix_tokens": prefix.length if prefix else 0,
        "prompt_tokens": sum(item.cost for item in shared) / n,
    }


@contextmanager
def _no_head(backend: LLMRerankerBackend) -> Iterator[None]:
    """The backend with no template head while inside: every request's prefix runs whole, head included."""
    heads = backend.heads
    backend.heads = ()
    try:
        yield
    finally:
        backend.heads = heads


def _head_speedup(backend: LLMRerankerBackend, requests: list[list[Encoded]]) -> dict[str, float]:
    """CPU seconds of forwards of the requests' prompts (one batch) without a template head over with the
    head's kept cache (warmed first), best of 3 each, alternating."""
    batch = [item for request in requests for item in request]
    backend.forward(batch)  # the head is run and kept
    times: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(3):
        for name in ("with", "without"):
            with _no_head(backend) if name == "without" else nullcontext():
                start = Reading.take(None)
                for _ in range(HEAD_REPEATS):
                    backend.forward(batch)
                times[name].append(Reading.take(None).minus(start)["own_cpu_s"])
    with_s, without_s = min(times["with"]), min(times["without"])
    return {
        "with_cpu_s": with_s,
        "without_cpu_s": without_s,
        "speedup": without_s / with_s,
        "head_tokens": len(backend.heads[0]),
        "prompt_tokens": sum(item.cost for item in batch) / len(batch),
        "requests": len(requests),
    }
