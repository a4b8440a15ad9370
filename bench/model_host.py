"""``python -m bench.model_host [--smoke] [--out DIR] [--device cuda] [--model peers]``: where the model runs.

Issue 30's CPU regime: a near-free model (a random 1-layer, width-32 BERT cross-encoder with MiniLM's tokenizer,
whose forward is a chain of tiny operators as on a GPU; ``--model peers``: a MiniLM-L-6-shaped one instead),
served by three real ``scorekit serve`` processes started side by side, one in process, one with ``--model-host
process`` and one with ``--api-processes 2`` (two front ends feeding one model host process), under the same
closed-loop /rerank load (1 query x 16 documents, concurrency 32), the three alternating window by window.
Each window reports:

- items/s: pairs scored per wall second (the server's own ``scorekit_batch_size`` sum over the window);
- the coupling: the served forward's seconds per item (``scorekit_inference_duration_seconds`` sum over the
  ``scorekit_batch_size`` sum, deltas over the window) over the same forward alone in this process, at the
  window's mean batch size and torch's intra-op threads here (the server's default), measured right after;
- the server's cores: CPU seconds of the server and its child processes (the model host, the front ends) over
  wall seconds, against the cores the load generator leaves (the CPUs less its own CPU rate: ``core_share``),
  and against what it and other jobs on the machine leave (``core_share_of_free``).

Figures are medians over the rounds; the full run writes ``bench/results/model-host.json`` (``--model peers``:
``model-host-peers.json``), ``--smoke`` a temporary folder (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.corpus import rerank_set
from bench.driver import loadgen, write_spec
from bench.servers import Server, running, spawn_scorekit
from bench.standalone import run_tool

if TYPE_CHECKING:
    from bench.rawforward import Ceiling

MODES: dict[str, tuple[str, ...]] = {
    "in_process": (),
    "host_process": ("--model-host", "process"),
    "api_processes_2": ("--api-processes", "2"),
}
# Issue 30's targets: the coupling with a model host process, and two front ends' items/s over in process.
COUPLING_TARGET = 1.15
SPEEDUP_TARGET = 1.6


@dataclass(frozen=True, slots=True)
class Sizes:
    docs: int = 16
    concurrency: int = 32
    rounds: int = 2
    warmup_s: float = 2.0
    window_s: float = 8.0
    raw_s: float = 2.0  # the forward alone, after each window


FULL = Sizes()
SMOKE = Sizes(docs=4, concurrency=8, rounds=1, warmup_s=0.3, window_s=0.8, raw_s=0.2)


def build_model(folder: Path, model: str) -> Path:
    """``near-free``: the 1-layer, width-32 cross-encoder of issue 30's regime; ``peers``: bench.peers's
    cross-encoder of ms-marco-MiniLM-L-6's shape (6 layers, width 384), whose forward is most of an item's cost."""
    if model == "peers":
        from bench.peers import build_cross_encoder as build_peers

        return build_peers(folder)
    from tests.tiny_models import build_cross_encoder

    return build_cross_encoder(folder, layers=1)


MODELS = {"near-free": {"layers": 1, "hidden_size": 32}, "peers": {"layers": 6, "hidden_size": 384}}


def raw_forward(folder: Path, device: str, texts: list[list[str]]) -> Ceiling:
    """The served model loaded in this process, and every request's pairs tokenized once."""
    from bench.rawforward import Ceiling
    from scorekit.models import load_backend

    backend = load_backend(str(folder), device=device)
    encode = backend.encode_pairs  # type: ignore[attr-defined]
    inputs = [item for query, *docs in texts for item in encode([query] * len(docs), docs, None, None)]
    return Ceiling(backend, inputs, 0.0)


def window(server: Server, spec: Path, sizes: Sizes) -> dict[str, Any]:
    """One closed-loop window, with the server's metrics and its process tree's CPU read at the edges."""
    args: list[object] = ["--spec", spec, "--concurrency", sizes.concurrency, "--warmup", sizes.warmup_s]
    args += ["--window", sizes.window_s, "--max-requests", 1_000_000, "--min-completed", 2]
    result = loadgen("closed", server.port, *args, "--pid", server.pid, "--tree", "--metrics")
    metrics, cpu = result["metrics"], result["cpu"]
    items = metrics["batch_items"]
    wall = cpu["wall_s"]
    loadgen_cores = cpu["own_cpu_s"] / wall
    cores_left = (os.cpu_count() or 1) - loadgen_cores
    # What other jobs on a shared machine kept busy is not the server's to take either.
    cores_left_by_all = max(cores_left - cpu["other_cores"], 1e-9)
    server_cores = cpu["server_cpu_s"] / wall
    return {
        "items_per_s": items / metrics["seconds"],
        "items_per_server_cpu_s": items / max(cpu["server_cpu_s"], 1e-9),
        "mean_batch": items / max(metrics["batches"], 1),
        "served_s_per_item": metrics["inference_s"] / max(items, 1),
        "server_cores": server_cores,
        "loadgen_cores": loadgen_cores,
        "cores_left": cores_left,
        "core_share": server_cores / cores_left,
        "core_share_of_free": server_cores / cores_left_by_all,
        "other_cores": cpu["other_cores"],
        "p99_ms": result["latency_ms"]["p99"],
        "statuses": result["statuses"],
    }


def raw_s_per_item(ceiling: Ceiling, batch: int, seconds: float) -> dict[str, float]:
    """The forward alone at ``batch`` items: wall seconds per item, and the cores other jobs kept busy."""
    rate = ceiling.rate(batch, seconds)
    return {"raw_s_per_item": 1 / rate.items_per_s, "raw_other_cores": rate.other_cores}


def run(sizes: Sizes, device: str, model: str, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    folder = build_model(work / "cross-encoder", model)
    requests = rerank_set(64, sizes.docs)
    spec = write_spec(work, "rerank", "/rerank", requests.bodies)
    common = ("--model", str(folder), "--device", device)
    servers = {mode: spawn_scorekit(mode, work, (*common, *extra)) for mode, extra in MODES.items()}

    try:
        ceiling = raw_forward(folder, device, requests.texts)  # torch loads while the servers start
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    rounds: list[dict[str, dict[str, Any]]] = []
    with running(*servers.values()):
        for index in range(sizes.rounds):
            this: dict[str, dict[str, Any]] = {}
            for mode, server in servers.items():
                log(f"[model_host] round {index + 1}/{sizes.rounds}: {mode}")
                point = window(server, spec, sizes)
                point.update(raw_s_per_item(ceiling, max(1, round(point["mean_batch"])), sizes.raw_s))
                point["coupling"] = point["served_s_per_item"] / point["raw_s_per_item"]
                this[mode] = point
            rounds.append(this)
    return {
        "sizes": {
            "docs": sizes.docs,
            "concurrency": sizes.concurrency,
            "rounds": sizes.rounds,
            "window_s": sizes.window_s,
        },
        "model": {"name": model, **MODELS[model], "device": device},
        "intra_op_threads": ceiling.threads,
        "nproc": os.cpu_count(),
        "rounds": rounds,
        **summarize(rounds),
    }


KEYS = (
    "items_per_s",
    "items_per_server_cpu_s",
    "coupling",
    "mean_batch",
    "server_cores",
    "loadgen_cores",
    "cores_left",
    "core_share",
    "other_cores",
    "core_share_of_free",
)


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians over the rounds per mode, and each mode's items/s over in process's, round by round."""
    modes = {mode: {key: statistics.median(r[mode][key] for r in rounds) for key in KEYS} for mode in MODES}
    over = {
        mode: statistics.median(r[mode]["items_per_s"] / r["in_process"]["items_per_s"] for r in rounds)
        for mode in MODES
        if mode != "in_process"
    }
    return {"modes": modes, "over_in_process": over}


def table(result: dict[str, Any]) -> str:
    modes = result["modes"]
    lines = [f"{'figure':<28}" + "".join(f"{mode:>16}" for mode in MODES)]
    for key in KEYS:
        lines.append(f"{key:<28}" + "".join(f"{modes[mode][key]:>16.3f}" for mode in MODES))
    for mode in ("host_process", "api_processes_2"):
        coupling = modes[mode]["coupling"]
        met = "met" if coupling <= COUPLING_TARGET else "missed"
        lines.append(f"\n{mode} coupling {coupling:.2f} (target <= {COUPLING_TARGET}: {met})")
    over = result["over_in_process"]
    lines.append(f"items/s over in process: host process {over['host_process']:.2f}")
    met = "met" if over["api_processes_2"] >= SPEEDUP_TARGET else "missed"
    lines.append(
        f"items/s over in process: --api-processes 2 {over['api_processes_2']:.2f} (target >= {SPEEDUP_TARGET}: {met})"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_host", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="toy sizes: one short round")
    parser.add_argument("--out", type=Path, help="results folder (default: bench/results; smoke: a temp dir)")
    parser.add_argument("--device", default="cpu", help="torch device of both servers and the forward alone")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default: 2; smoke: 1)")
    parser.add_argument(
        "--model",
        choices=tuple(MODELS),
        default="near-free",
        help="the served cross-encoder: near-free (issue 30's regime) or peers (a MiniLM-L-6-shaped one); peers"
        " writes model-host-peers.json",
    )
    parser.add_argument("--keep-work", action="store_true", help="keep the folder of server logs and the model")
    args = parser.parse_args(argv)
    # Before torch loads, as the harness does for every server (docs/benchmarks.md, "How it measures").
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    sizes = SMOKE if args.smoke else FULL
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    return run_tool(
        "model_host",
        lambda work, log: run(sizes, args.device, args.model, work, log),
        smoke=args.smoke,
        out=args.out,
        filename="model-host.json" if args.model == "near-free" else f"model-host-{args.model}.json",
        table=table,
        keep_work=args.keep_work,
        kept="server logs and the model",
    )


if __name__ == "__main__":
    sys.exit(main())
