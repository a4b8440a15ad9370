"""``python -m bench [--smoke] [--only a,b] [--out DIR]``: run the scenarios, print the table, write results.

The full run writes bench/results/*.json and *.png (committed). A smoke run writes to a temporary
folder unless ``--out`` says otherwise, so it never overwrites the committed figures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import plots, report
from bench.context import Context
from bench.corpus import rerank_set
from bench.driver import write_spec
from bench.profiles import FULL, SMOKE, Profile
from bench.servers import ROOT, Server, running, spawn_scorekit, spawn_uvicorn

SCENARIOS = ("efficiency", "batching", "disconnect", "fairness", "overhead", "growth", "llm_reranker", "gpu")
MODEL_SCENARIOS = {"efficiency", "batching", "disconnect", "fairness", "growth"}


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import torch

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": list(os.getloadavg()),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
    }


def selected(only: str | None) -> list[str]:
    import torch

    names = SCENARIOS if not only else tuple(name.strip() for name in only.split(","))
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios: {sorted(unknown)}; choose from {SCENARIOS}")
    if "gpu" in names and not torch.cuda.is_available():
        if only:
            raise SystemExit("the gpu scenario needs a CUDA device, and torch sees none here")
        names = tuple(name for name in names if name != "gpu")  # the full run's GPU figure, where there is a GPU
    if "batching" in names and "efficiency" not in names:
        names = ("efficiency", *names)
    return [name for name in SCENARIOS if name in names]


def spawn_shared(profile: Profile, names: Sequence[str], work: Path) -> dict[str, Server]:
    """Every server the scenarios share, started at once so their start-up overlaps."""
    servers: dict[str, Server] = {}
    if MODEL_SCENARIOS & set(names):
        servers["scorekit"] = spawn_scorekit("scorekit", work, profile.scorekit_args)
    if "batching" in names:
        servers["naive"] = spawn_uvicorn("naive", "bench.naive:create_app", work)
    if "overhead" in names:
        from bench.scenarios import overhead

        servers.update(overhead.spawn(work))
    return servers


def run(profile: Profile, names: Sequence[str], out: Path, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    requests = rerank_set(64 if profile.name == "full" else 16, profile.docs_per_request)
    spec = write_spec(work, "rerank", "/rerank", requests.bodies)
    results: dict[str, Any] = {}
    shared = spawn_shared(profile, names, work)
    ceiling = None
    if "efficiency" in names:
        from bench.rawforward import Ceiling  # torch loads here while the servers start

        ceiling = Ceiling.load(requests.texts)
    with running(*shared.values()):
        ctx = Context(profile, out, work, requests, spec, shared)
        for name in names:
            log(f"[bench] {name} ...")
            started = time.perf_counter()
            module = importlib.import_module(f"bench.scenarios.{name}")
            if name == "efficiency":
                results[name] = module.run(ctx, ceiling)
            elif name == "batching":
                results[name] = module.run(ctx, shared["naive"], results["efficiency"])
            else:
                if name == "growth" and profile.fresh_growth_server:
                    for server in shared.values():
                        server.stop()  # a quiet machine for the fresh server's memory figures
                results[name] = module.run(ctx)
            results[name]["scenario_seconds"] = time.perf_counter() - started
            log(f"[bench] {name} took {results[name]['scenario_seconds']:.1f}s")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="toy sizes, a few seconds per scenario")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--out", type=Path, help="results folder (default: bench/results; smoke: a temp dir)")
    parser.add_argument("--keep-work", action="store_true", help="keep the folder of server logs and specs")
    parser.add_argument(
        "--omp-wait",
        choices=["passive", "active"],
        default="passive",
        help="OMP_WAIT_POLICY for this process and every server (default: passive; see docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)
    # Before torch loads: with the library's default (active) policy, OpenMP threads spin at every
    # barrier, and on a shared machine each forward then waits for descheduled spinners (3-20x slower,
    # CPU time inflated alike). Both sides of every ratio run under the same policy.
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait.upper()
    profile = SMOKE if args.smoke else FULL
    out = args.out or (Path(tempfile.mkdtemp(prefix="bench-smoke-")) if args.smoke else ROOT / "bench" / "results")
    work = Path(tempfile.mkdtemp(prefix="bench-work-"))
    names = selected(args.only)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = time.perf_counter()
    info = machine()
    try:
        results = run(profile, names, out, work, log)
    except BaseException:
        log(f"[bench] failed; server logs are in {work}")
        raise
    rows = report.evaluate(results)
    info["loadavg_end"] = list(os.getloadavg())
    summary = {
        "profile": profile.name,
        "scenarios": names,
        "machine": info,
        "targets": rows,
        "wall_seconds": time.perf_counter() - started,
    }
    report.write(out, results, summary)
    drawn = plots.draw(out, results)
    print(report.table(rows))
    print(f"\nresults: {out}  ({', '.join(p.name for p in drawn)})  wall {summary['wall_seconds']:.0f}s")
    if args.keep_work:
        print(f"server logs and specs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
