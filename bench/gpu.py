"""``python -m bench.gpu`` on a machine with a GPU: scorekit's items/s over the raw forward's, per model.

For each model, the backend's own ``forward`` runs first in this process on the exact inputs the server will
batch (every request's plan, encoded once, fp16 on the GPU by default), at each batch size of a sweep; the best
size is the ceiling. Then ``scorekit serve --device cuda --dtype float16`` serves the same folder under
closed-loop /rerank load (one query, 16 documents) at each concurrency, and the ceiling is measured again after
every window; each window is divided by the mean of the two ceilings around it, so drift cancels. The ratio is
in wall time: on a GPU the work is the device's, and the CPU-time form the CPU benchmarks use says nothing
about it. The target is >= 0.9 at concurrency 32 (issue 12).

Models: the embedded all-MiniLM-L6-v2 (a bi-encoder: a rerank embeds the query and each document), and random
BERT cross-encoders of bge-reranker-base's and bge-reranker-large's shape (12 layers of width 768, 24 of 1024)
with MiniLM's tokenizer: a forward costs what a real one of that shape does, and random weights score
nonsense, which no speed depends on. ``--variant NAME=FLAGS`` adds a server started with more flags (a batch
budget, say), measured beside the defaults.

    python -m bench.gpu                              # cuda, float16, all three models, defaults only
    python -m bench.gpu --models base --variant big='--max-batch-size 512 --max-batch-tokens 65536'
    python -m bench.gpu --device cpu --dtype float32 --models minilm --seconds 0.3 --window 2   # a dry run
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from bench.corpus import rerank_set
from bench.driver import loadgen, write_spec
from bench.rawforward import Ceiling, Rate
from bench.servers import ROOT, Server, running, spawn_scorekit
from scorekit.models import default_model_path, load_backend
from scorekit.models.base import PairScorer, no_checkpoint
from scorekit.tasks import PairOptions

# (width, layers, heads, feed-forward width) of the random cross-encoders.
SHAPES = {"base": (768, 12, 12, 3072), "large": (1024, 24, 16, 4096)}
MODELS = ("minilm", "base", "large")
DOCS = 16
TARGET = 0.9
TARGET_CONCURRENCY = 32


def model_folder(name: str, work: Path) -> str:
    """The embedded model's folder, or a random cross-encoder of one of ``SHAPES`` (the same on every run)."""
    if name == "minilm":
        return default_model_path()
    width, layers, heads, feed_forward = SHAPES[name]
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=feed_forward,
        num_labels=1,
    )
    folder = work / name
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return str(folder)


def ceiling(folder: str, texts: Sequence[Sequence[str]], device: str, dtype: str) -> Ceiling:
    """The backend loaded as the server loads it, and every request's inputs as the server batches them."""
    backend = load_backend(folder, device=device, dtype=dtype)
    assert isinstance(backend, PairScorer)
    started = time.perf_counter()
    inputs = []
    for query, *documents in texts:
        inputs += backend.plan_pairs([query], documents, PairOptions()).encode(no_checkpoint).inputs
    return Ceiling(backend, inputs, len(inputs) / (time.perf_counter() - started))


def window(server: Server, spec: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    args: list[object] = ["--spec", spec, "--concurrency", concurrency, "--warmup", 2.0, "--window", seconds]
    args += ["--max-requests", 1_000_000, "--min-completed", 2, "--pid", server.pid, "--metrics"]
    result = loadgen("closed", server.port, *args)
    metrics = result["metrics"]
    return {
        "concurrency": concurrency,
        "server_items_per_s": result["server_items_per_s"],
        "rps": result["rps"],
        "mean_batch": metrics["batch_items"] / max(metrics["batches"], 1),
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "statuses": result["statuses"],
        "server_cpu_cores": result["cpu"]["server_cpu_s"] / result["window_s"],
    }


@dataclass(frozen=True, slots=True)
class Run:
    """What one measurement runs: the device and dtype, the raw forward's sweep and each measurement's seconds,
    and the server windows."""

    device: str
    dtype: str
    batch_sizes: Sequence[int]
    seconds: float
    window: float
    concurrencies: Sequence[int]


def measure(
    name: str, run: Run, variants: dict[str, list[str]], work: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    folder = model_folder(name, work)
    requests = rerank_set(64, DOCS)
    spec = write_spec(work, f"rerank-{name}", "/rerank", requests.bodies)
    raw = ceiling(folder, requests.texts, run.device, run.dtype)
    for size in run.batch_sizes:  # the first call of each shape pays for kernel selection and the allocator
        raw.backend.forward(raw.inputs[:size])
    sweep = raw.sweep(run.batch_sizes, run.seconds)
    best = max(sweep, key=lambda size: sweep[size].items_per_s)
    log(f"[gpu] {name}: raw forward best at batch {best}: {sweep[best].items_per_s:.0f} items/s")
    result: dict[str, Any] = {
        "mean_tokens_per_item": raw.mean_tokens,
        "sweep": {str(size): rate.as_dict() for size, rate in sweep.items()},
        "best_batch_size": best,
        "variants": {},
    }
    for variant, flags in variants.items():
        server_args = ["--model", folder, "--device", run.device, "--dtype", run.dtype, *flags]
        server = spawn_scorekit(f"scorekit-{name}-{variant}", work, server_args)
        rates: list[Rate] = [raw.rate(best, run.seconds)]
        points = []
        with running(server, timeout=600):
            for concurrency in run.concurrencies:
                point = window(server, spec, concurrency, run.window)
                rates.append(raw.rate(best, run.seconds))
                point["ceiling_items_per_s"] = (rates[-2].items_per_s + rates[-1].items_per_s) / 2
                point["ratio"] = point["server_items_per_s"] / point["ceiling_items_per_s"]
                log(
                    f"[gpu] {name} {variant} c={concurrency}: {point['server_items_per_s']:.0f} items/s, "
                    f"ratio {point['ratio']:.2f}, mean batch {point['mean_batch']:.0f}, p99 {point['p99_ms']:.1f} ms"
                )
                points.append(point)
        result["variants"][variant] = {"flags": flags, "points": points}
    del raw
    if run.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def table(results: dict[str, Any]) -> str:
    lines = [f"| model | server flags | concurrency | server items/s | raw items/s | ratio (target >= {TARGET}) |"]
    lines.append("|---|---|---:|---:|---:|---:|")
    for name, model in results["models"].items():
        for variant in model["variants"].values():
            flags = " ".join(variant["flags"]) or "(defaults)"
            for point in variant["points"]:
                lines.append(
                    f"| {name} | {flags} | {point['concurrency']} | {point['server_items_per_s']:.0f} | "
                    f"{point['ceiling_items_per_s']:.0f} (batch {model['best_batch_size']}) | {point['ratio']:.2f} |"
                )
    return "\n".join(lines)


def parse_variants(given: Sequence[str]) -> dict[str, list[str]]:
    variants: dict[str, list[str]] = {"defaults": []}
    for text in given:
        name, sep, flags = text.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variant takes NAME=FLAGS, got {text!r}")
        variants[name] = shlex.split(flags)
    return variants


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    parser.add_argument("--dtype", default="float16", help="the raw forward's and the server's dtype")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--concurrencies", default="8,32,64", help="closed-loop connections per window")
    parser.add_argument("--batch-sizes", default="16,32,64,128,256,512", help="the raw forward's sweep")
    parser.add_argument("--seconds", type=float, default=1.0, help="each raw-forward measurement")
    parser.add_argument("--window", type=float, default=8.0, help="each server window (after 2 s of warm-up)")
    parser.add_argument("--variant", action="append", default=[], help="NAME=FLAGS: one more server per model")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu-models.json")
    args = parser.parse_args(argv)
    models = [name.strip() for name in args.models.split(",")]
    if unknown := sorted(set(models) - set(MODELS)):
        raise SystemExit(f"unknown models {unknown}: choose from {','.join(MODELS)}")
    run = Run(
        device=args.device,
        dtype=args.dtype,
        batch_sizes=[int(size) for size in args.batch_sizes.split(",")],
        seconds=args.seconds,
        window=args.window,
        concurrencies=[int(c) for c in args.concurrencies.split(",")],
    )
    variants = parse_variants(args.variant)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    device = torch.device(args.device)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "docs_per_request": DOCS,
        "models": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        for name in models:
            results["models"][name] = measure(name, run, variants, Path(work), log)
            # after each model, so a run cut short by a time limit keeps what it measured
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['device']}, {args.dtype}, torch {torch.__version__}")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
