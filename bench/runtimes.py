"""``python -m bench.runtimes``: the CPU runtimes that could run a model's forward beside torch, measured side by
side in one process: torch eager (float32, and with bfloat16 weights as ``--dtype bfloat16`` loads them), ONNX
Runtime and OpenVINO (fp32, and OpenVINO's default precision, which is bf16 on a CPU with native bf16 and f32
elsewhere), on the embedded MiniLM bi-encoder and a random cross-encoder of ms-marco-MiniLM-L-6's shape, at batch 1
and 32.

Both runtimes run the same ONNX file, exported from the transformers module as ``--runtime onnx`` exports it,
with as many threads as torch has and no busy-waiting (the reason the CLI sets OMP_WAIT_POLICY=PASSIVE).
Throughput is items per CPU second of this process (``time.process_time``, every thread), as the other benchmarks
report it; the rounds alternate the runtimes so a neighbour's load lands on all of them. The error is the largest
absolute difference from torch's float32 output over the same 32 inputs: the normalised mean-pooled embedding, or
the logit. It needs the onnx and openvino extras (``make install`` installs both).

``--served`` measures what reaches a client instead (see ``served``): two servers, ``--runtime torch`` and
``--runtime onnx``, under the same HTTP load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Before torch loads, as the CLI does: torch's OpenMP threads would otherwise spin at barriers, and on a shared
# CPU that spinning, not the forward, is most of torch's CPU time at batch 1.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from bench.corpus import documents, queries, rerank_set
from bench.driver import write_spec
from bench.peers import CONCURRENCIES, DOCS, NAME, build_cross_encoder, check_same_scores, window
from bench.servers import running, spawn_scorekit
from scorekit.models import default_model_path
from scorekit.models.runtime.export import MODEL_FILE, export

RESULTS = Path(__file__).parent / "results"
NAMES = ("input_ids", "attention_mask", "token_type_ids")
BATCHES = (1, 32)
Forward = Callable[[dict[str, np.ndarray]], np.ndarray]


def runtimes(model: torch.nn.Module, output: str, onnx: Path) -> dict[str, Forward]:
    """Each runtime's forward on numpy inputs; the same thread count for all."""
    import onnxruntime
    import openvino

    threads = torch.get_num_threads()

    def eager(feed: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = model(**{name: torch.from_numpy(value) for name, value in feed.items()})
        return np.asarray(out[output].numpy())

    # torch's own best CPU option where the CPU has native bf16: the weights in bfloat16 (--dtype bfloat16).
    halved = copy.deepcopy(model).to(torch.bfloat16)

    def eager_bf16(feed: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = halved(**{name: torch.from_numpy(value) for name, value in feed.items()})
        return np.asarray(out[output].float().numpy())

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])
    core = openvino.Core()
    compiled = {
        precision: core.compile_model(str(onnx), "CPU", {"INFERENCE_NUM_THREADS": threads, **hint})
        for precision, hint in (("f32", {"INFERENCE_PRECISION_HINT": "f32"}), ("default", {}))
    }
    default_precision = compiled["default"].get_property("INFERENCE_PRECISION_HINT").to_string()
    return {
        "torch": eager,
        "torch-bfloat16": eager_bf16,
        "onnxruntime": lambda feed: np.asarray(session.run(None, feed)[0]),
        "openvino": lambda feed: np.asarray(compiled["f32"](feed)[0]),
        f"openvino-{default_precision}": lambda feed: np.asarray(compiled["default"](feed)[0]),
    }


def answer(kind: str, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """What scorekit serves from the output: the normalised mean-pooled embedding, or the logit."""
    if kind == "cross-encoder":
        return out[:, 0]
    weights = mask[..., None].astype(np.float32)
    pooled = (out * weights).sum(1) / weights.sum(1)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def items_per_cpu_s(forward: Forward, batches: Sequence[dict[str, np.ndarray]], seconds: float) -> float:
    """Run the batches in turn for about ``seconds`` of CPU time; items per CPU second of this process."""
    forward(batches[0])  # warm-up
    items, start = 0, time.process_time()
    while (spent := time.process_time() - start) < seconds or items == 0:
        for batch in batches:
            forward(batch)
            items += len(batch["input_ids"])
    return items / spent


def measure(kind: str, folder: str, work: Path, seconds: float, rounds: int) -> dict[str, Any]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    docs = documents(64)
    if kind == "cross-encoder":
        model, output = AutoModelForSequenceClassification.from_pretrained(folder).eval(), "logits"
        pairs = list(zip(queries(64), docs, strict=True))

        def tokenize(rows: slice) -> dict[str, np.ndarray]:
            firsts, seconds_ = zip(*pairs[rows], strict=True)
            return dict(tokenizer(list(firsts), list(seconds_), padding=True, return_tensors="np"))
    else:
        model, output = AutoModel.from_pretrained(folder).eval(), "last_hidden_state"

        def tokenize(rows: slice) -> dict[str, np.ndarray]:
            return dict(tokenizer(docs[rows], padding=True, return_tensors="np"))

    started = time.perf_counter()
    export(model, output, NAMES, work / kind)
    export_s = time.perf_counter() - started
    forwards = runtimes(model, output, work / kind / MODEL_FILE)
    check = tokenize(slice(0, 32))
    reference = answer(kind, forwards["torch"](check), check["attention_mask"])
    errors = {
        name: float(np.abs(answer(kind, forward(check), check["attention_mask"]) - reference).max())
        for name, forward in forwards.items()
    }
    rates: dict[str, dict[str, list[float]]] = {str(size): {name: [] for name in forwards} for size in BATCHES}
    for size in BATCHES:
        batches = [tokenize(slice(start, start + size)) for start in range(0, 64, size)][:8]
        for _ in range(rounds):
            for name, forward in forwards.items():
                rates[str(size)][name].append(items_per_cpu_s(forward, batches, seconds))
    medians = {size: {name: statistics.median(values) for name, values in row.items()} for size, row in rates.items()}
    return {
        "export_s": export_s,
        "max_abs_error": errors,
        "items_per_cpu_s": medians,
        "vs_torch": {
            size: {name: value / row["torch"] for name, value in row.items()} for size, row in medians.items()
        },
    }


def served(seconds: float, rounds: int, work: Path) -> dict[str, Any]:
    """``scorekit serve --runtime torch`` and ``--runtime onnx`` on the MiniLM-L-6-sized cross-encoder, the same
    /rerank bodies (16 documents) to each at concurrency 1, 8 and 32, alternating (bench.peers' windows): the
    documents per server CPU second of onnx over torch, the median of the rounds."""
    folder = build_cross_encoder(work / NAME)
    bodies = [{**body, "model": NAME} for body in rerank_set(64, DOCS).bodies]
    spec = write_spec(work, "runtimes", "/rerank", bodies)
    flags = ("--model", str(folder), "--served-model-name", NAME, "--cache-dir", str(work / "cache"))
    servers = {runtime: spawn_scorekit(runtime, work, (*flags, "--runtime", runtime)) for runtime in ("torch", "onnx")}
    with running(*servers.values(), timeout=600):
        check_same_scores((servers["torch"], servers["onnx"]), bodies[0])
        windows = [
            {f"{name}@{c}": window(server, spec, c, seconds) for c in CONCURRENCIES for name, server in servers.items()}
            for _ in range(rounds)
        ]
    ratios = {
        str(c): statistics.median(r[f"onnx@{c}"]["docs_per_cpu_s"] / r[f"torch@{c}"]["docs_per_cpu_s"] for r in windows)
        for c in CONCURRENCIES
    }
    return {"docs_per_request": DOCS, "rounds": windows, "onnx_over_torch_docs_per_cpu_s": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtimes", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="CPU seconds per runtime, batch size and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--served",
        action="store_true",
        help="instead: two servers, --runtime torch and onnx, under HTTP load (runtimes-served.json)",
    )
    parser.add_argument("--window", type=float, default=6.0, help="with --served: seconds per measured window")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the folder the JSON goes to")
    args = parser.parse_args(argv)
    if args.served:
        with tempfile.TemporaryDirectory() as scratch:
            result = served(args.window, args.rounds, Path(scratch))
        (args.out / "runtimes-served.json").write_text(json.dumps(result, indent=2) + "\n")
        for c, ratio in result["onnx_over_torch_docs_per_cpu_s"].items():
            print(f"concurrency {c:>2}: onnx / torch {ratio:.2f}x documents per server CPU second")
        return 0
    results: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "native_bf16": [flag for flag, on in torch.cpu.get_capabilities().items() if "bf16" in flag and on is True],
    }
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        folders = {"bi-encoder": default_model_path(), "cross-encoder": str(build_cross_encoder(work / "ce"))}
        for kind, folder in folders.items():
            results[kind] = measure(kind, folder, work, args.seconds, args.rounds)
    (args.out / "runtimes.json").write_text(json.dumps(results, indent=2) + "\n")
    for kind in folders:
        print(f"{kind}: export {results[kind]['export_s']:.1f} s")
        for name, error in results[kind]["max_abs_error"].items():
            ratios = "  ".join(f"batch {size}: {row[name]:.2f}x" for size, row in results[kind]["vs_torch"].items())
            print(f"  {name:18} {ratios}   max abs error {error:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
