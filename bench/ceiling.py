"""``python -m bench.ceiling``: the most documents per CPU second this CPU could score on the peers cross-encoder, if
every multiply-add ran at the CPU's own matrix-multiply peak.

Two measurements, both in this process: the model's floating-point operations per document (torch's
``FlopCounterMode`` over a forward of each peers request, padded as a request's batch is: the projections' and
feed-forward layers' matrix products; attention's own, which run in SDPA's CPU kernel (1-2% of the products at ~40
tokens), layer norms, softmax and GELU add work it does not count, so the ceiling errs high), and the best matrix
products per CPU second one thread reaches on this CPU, at the model's own shapes and at a large square, in the
dtype served. Their quotient is a ceiling no server can pass on this machine: a server's documents per CPU second
over it is the share of the CPU's peak that reaches clients, and the ceiling over a peer's figure is the most any
server could gain on that peer here. ``bench.peers`` prints both beside its ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSequenceClassification, AutoTokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def flops_per_document(folder: Path, bodies: Sequence[dict[str, Any]]) -> float:
    """The cross-encoder's operations per document over ``bodies`` (each request one padded batch)."""
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    flops = documents = 0
    with torch.inference_mode():
        for body in bodies:
            texts = body["documents"]
            inputs = tokenizer([body["query"]] * len(texts), texts, padding=True, truncation=True, return_tensors="pt")
            counter = FlopCounterMode(display=False)
            with counter:
                model(**inputs)
            flops += counter.get_total_flops()
            documents += len(texts)
    return flops / documents


def matmul_peak(dtype: torch.dtype, shapes: Sequence[tuple[int, int, int]], seconds: float = 1.5) -> float:
    """The best operations per CPU second of one thread's matrix products over ``shapes`` (m, k, n)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per CPU second: one thread keeps the clock honest (no waiting at barriers)
    try:
        best = 0.0
        for m, k, n in shapes:
            left, right = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            for _ in range(3):
                left @ right
            runs, started = 0, time.process_time()
            while time.process_time() - started < seconds:
                left @ right
                runs += 1
            best = max(best, 2 * m * k * n * runs / (time.process_time() - started))
        return best
    finally:
        torch.set_num_threads(threads)


def ceiling(folder: Path, bodies: Sequence[dict[str, Any]], dtype: str = "float32") -> dict[str, float]:
    """The documents per CPU second at the matrix-multiply peak, and the two figures it comes from."""
    config = json.loads((folder / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    tokens = 16 * 40  # a peers batch: 16 pairs of about 40 tokens
    shapes = [(tokens, hidden, inner), (tokens, inner, hidden), (tokens, hidden, hidden), (2048, 2048, 2048)]
    per_document = flops_per_document(folder, bodies)
    peak = matmul_peak(DTYPES[dtype], shapes)
    return {"flops_per_document": per_document, "peak_flops_per_cpu_s": peak, "docs_per_cpu_s": peak / per_document}


def main(argv: list[str] | None = None) -> int:
    from bench.corpus import rerank_set
    from bench.peers import DOCS, build_cross_encoder

    parser = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    args = parser.parse_args(argv)
    folder = build_cross_encoder(Path(tempfile.mkdtemp(prefix="bench-ceiling-")) / "cross-encoder")
    found = ceiling(folder, rerank_set(64, DOCS).bodies, args.dtype)
    print(
        f"{found['flops_per_document'] / 1e9:.3f} GFLOP per document; {args.dtype} matrix products at"
        f" {found['peak_flops_per_cpu_s'] / 1e9:.0f} GFLOP per CPU second: at most"
        f" {found['docs_per_cpu_s']:.0f} documents per CPU second"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
