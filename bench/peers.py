"""``python -m bench.peers`` (``make bench-peers``): scorekit against Infinity, side by side, on one cross-encoder.

Both servers serve the same folder: a random BERT cross-encoder the size of ms-marco-MiniLM-L-6 (6 layers,
width 384) with MiniLM's tokenizer, so a forward costs what a real one does (random weights score nonsense,
which neither server's speed depends on). Infinity runs from a virtual environment of its own,
``.venv-infinity`` (made on first use: ``infinity-emb[server,torch]`` pinned, torch pinned to the CPU wheel),
with ``DO_NOT_TRACK=1`` and its usage statistics off. Both run in float32 on the CPU, each with its defaults
but OpenMP's wait policy, passive for both (scorekit's default; see ``spawn_infinity``). ``--runtime onnx``
(or ``openvino``) serves scorekit's side with that runtime (ONNX Runtime or OpenVINO, also exact in float32) against
the same Infinity.
``--dtype bfloat16`` serves both in bfloat16 (each server's best CPU option where the CPU has native bf16); their
scores then differ by each one's rounding, so the check that both serve the same model allows bf16's error.

The same /rerank bodies (one query, 16 documents) go to each server at concurrency 1, 8 and 32, the two servers
alternating for 3 rounds; each window reports documents scored per CPU second of the server process (the form
that holds still on a shared machine) and the p99 latency. The figure is scorekit / Infinity, the median of
the rounds; the target is >= 1.3 at 8 and 32. Then ``bench.ceiling`` puts both beside the most documents per CPU
second this CPU's matrix-multiply peak allows on the model, in the dtype served: how much of the CPU each server
turns into scores, and the most any server could gain on Infinity here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from bench.ceiling import ceiling
from bench.corpus import rerank_set
from bench.driver import loadgen, write_spec
from bench.servers import NO_PROXY, ROOT, Server, child_env, free_port, running, spawn_command, spawn_scorekit
from scorekit.models import default_model_path

INFINITY = "infinity-emb[server,torch]==0.0.78"
VENV = ROOT / ".venv-infinity"
NAME = "bench-cross-encoder"
DOCS = 16
CONCURRENCIES = (1, 8, 32)
ROUNDS = 3


def ensure_infinity() -> Path:
    """Infinity's own virtual environment (a few minutes the first time); its executable."""
    executable = VENV / "bin" / "infinity_emb"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU wheel, before anything can pull CUDA's
        subprocess.run([*pip, INFINITY, "torch==2.13.0"], check=True)
    return executable


def build_cross_encoder(folder: Path) -> Path:
    """A random cross-encoder of ms-marco-MiniLM-L-6's shape (the same weights on every run)."""
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, num_labels=1
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


def spawn_infinity(executable: Path, folder: Path, work: Path, dtype: str = "float32") -> Server:
    port = free_port()
    command = [str(executable), "v2", "--model-id", str(folder), "--served-model-name", NAME]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--engine", "torch"]
    command += ["--log-level", "warning", "--no-model-warmup"]
    if dtype != "float32":  # float32 runs with Infinity's default, as before the option
        command += ["--dtype", dtype]
    # OpenMP's passive wait policy, which `scorekit serve` sets for itself: with the default (active) one, idle
    # OpenMP threads spin and bill CPU time that does no work, which would flatter scorekit here.
    env = child_env(
        {
            "DO_NOT_TRACK": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "HF_HUB_OFFLINE": "1",
            "OMP_WAIT_POLICY": "PASSIVE",
        }
    )
    return spawn_command("infinity", command, work, "/health", env)


def check_same_scores(servers: tuple[Server, Server], body: dict[str, Any], tolerance: float = 1e-4) -> None:
    """Both servers answer one body with the same scores (within ``tolerance``): they serve the same model."""
    scores = []
    for server in servers:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/rerank",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with NO_PROXY.open(request, timeout=60) as answer:
            results = json.loads(answer.read())["results"]
        scores.append({r["index"]: r["relevance_score"] for r in results})
    for index, score in scores[0].items():
        if abs(score - scores[1][index]) > tolerance:
            raise SystemExit(f"the servers disagree on document {index}: {score} against {scores[1][index]}")


def window(server: Server, spec: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    """One closed-loop window: documents per server CPU second, and the p99 latency."""
    args: list[object] = ["--spec", spec, "--concurrency", concurrency, "--warmup", 1.0, "--window", seconds]
    result = loadgen("closed", server.port, *args, "--max-requests", 100_000, "--min-completed", 2, "--pid", server.pid)
    documents = result["completed"] * DOCS
    return {
        "docs_per_cpu_s": documents / max(result["cpu"]["server_cpu_s"], 1e-9),
        "docs_per_s": documents / result["window_s"],
        "p99_ms": result["latency_ms"]["p99"],
        "statuses": result["statuses"],
        "other_cores": result["cpu"]["other_cores"],
    }


def run(
    seconds: float, work: Path, runtime: str = "torch", dtype: str = "float32", model_workers: int = 1
) -> dict[str, Any]:
    executable = ensure_infinity()
    folder = build_cross_encoder(work / NAME)
    requests = rerank_set(64, DOCS)
    spec = write_spec(work, "peers", "/rerank", [{**body, "model": NAME} for body in requests.bodies])
    options = ("--model", str(folder), "--served-model-name", NAME, "--runtime", runtime, "--dtype", dtype)
    scorekit = spawn_scorekit("scorekit", work, (*options, "--model-workers", str(model_workers)))
    infinity = spawn_infinity(executable, folder, work, dtype)
    rounds: list[dict[str, dict[str, Any]]] = []
    with running(scorekit, infinity, timeout=600):
        # bf16 of a random cross-encoder moves a score by up to 0.5 (docs/benchmarks.md, "bf16 on CPU")
        tolerance = 1e-4 if dtype == "float32" else 0.5
        check_same_scores((scorekit, infinity), {**requests.bodies[0], "model": NAME}, tolerance)
        for _ in range(ROUNDS):
            rounds.append(
                {
                    f"{name}@{c}": window(server, spec, c, seconds)
                    for c in CONCURRENCIES
                    for name, server in (("scorekit", scorekit), ("infinity", infinity))
                }
            )
    # After the servers stop, so the measure of the CPU's peak runs alone.
    peak = ceiling(folder, requests.bodies, dtype)
    return {
        "ceiling": {**peak, "shares": shares_of(rounds, peak["docs_per_cpu_s"])},
        "infinity": INFINITY,
        "scorekit_runtime": runtime,
        "scorekit_model_workers": model_workers,
        "dtype": dtype,
        "docs_per_request": DOCS,
        "rounds": rounds,
        "ratios": ratios_of(rounds),
    }


def shares_of(rounds: list[dict[str, dict[str, Any]]], most: float) -> dict[str, dict[str, float]]:
    """Per concurrency, each server's median documents per CPU second as a share of ``most`` (the ceiling), and
    the ceiling over Infinity's: the most any server could gain on Infinity here."""

    def median(c: int, name: str) -> float:
        return statistics.median(r[f"{name}@{c}"]["docs_per_cpu_s"] for r in rounds)

    return {
        str(c): {
            "scorekit": median(c, "scorekit") / most,
            "infinity": median(c, "infinity") / most,
            "ceiling_over_infinity": most / median(c, "infinity"),
        }
        for c in CONCURRENCIES
    }


def ratios_of(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per concurrency, the median over the rounds of scorekit / Infinity (per CPU second and per second) and
    of Infinity's p99 over scorekit's."""

    def median(c: int, key: str, over: str = "scorekit", under: str = "infinity") -> float:
        return statistics.median(r[f"{over}@{c}"][key] / r[f"{under}@{c}"][key] for r in rounds)

    return {
        str(c): {
            "docs_per_cpu_s": median(c, "docs_per_cpu_s"),
            "docs_per_s": median(c, "docs_per_s"),
            "p99_infinity_over_scorekit": median(c, "p99_ms", "infinity", "scorekit"),
        }
        for c in CONCURRENCIES
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--window", type=float, default=8.0, help="seconds per measured window")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where peers.json goes")
    parser.add_argument(
        "--runtime",
        choices=("torch", "onnx", "openvino"),
        default="torch",
        help="scorekit's --runtime (Infinity runs its torch engine); onnx writes peers-onnx.json, and so on",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="both servers' dtype; bfloat16 writes peers-bfloat16.json (or peers-onnx-bfloat16.json, ...)",
    )
    parser.add_argument(
        "--model-workers",
        type=int,
        choices=range(1, 9),
        default=1,
        metavar="N",
        help="scorekit's --model-workers (threads running batches at once); N > 1 writes peers-workersN.json",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    results = run(args.window, work, args.runtime, args.dtype, args.model_workers)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = [part for part in (args.runtime, args.dtype) if part not in ("torch", "float32")]
    if args.model_workers > 1:
        parts.append(f"workers{args.model_workers}")
    suffix = "".join(f"-{part}" for part in parts)
    name = f"peers{suffix}.json"
    (args.out / name).write_text(json.dumps(results, indent=1, sort_keys=True))
    header = f"{'concurrency':>11}  {'scorekit/Infinity docs per CPU-s':>33}  {'(per s)':>8}"
    print(f"{header}  {'Infinity p99 / scorekit p99':>28}")
    for c, ratio in results["ratios"].items():
        row = f"{c:>11}  {ratio['docs_per_cpu_s']:>32.2f}x  {ratio['docs_per_s']:>7.2f}x"
        print(f"{row}  {ratio['p99_infinity_over_scorekit']:>27.2f}x")
    print(f"(target >= 1.3x at 8 and 32; median of {ROUNDS} alternating rounds; {time.perf_counter() - started:.0f} s)")
    peak = results["ceiling"]
    print(
        f"ceiling (bench.ceiling): {peak['docs_per_cpu_s']:.0f} documents per CPU second at this CPU's {args.dtype}"
        f" matrix-multiply peak ({peak['peak_flops_per_cpu_s'] / 1e9:.0f} GFLOP per CPU s,"
        f" {peak['flops_per_document'] / 1e9:.2f} GFLOP per document)"
    )
    print(f"{'concurrency':>11}  {'scorekit / ceiling':>18}  {'Infinity / ceiling':>18}  {'ceiling / Infinity':>18}")
    for c, share in peak["shares"].items():
        print(
            f"{c:>11}  {share['scorekit']:>18.2f}  {share['infinity']:>18.2f}  {share['ceiling_over_infinity']:>17.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
