"""What a standalone bench tool (``python -m bench.<tool>``) does around its measure, the same for each: a work
folder for its servers' logs, the machine it ran on and how loaded it was at both ends (a figure from a busy
machine says so), the JSON written where ``--out`` says (a smoke run's in a temporary folder, so it never
overwrites a real run's results), its table printed, and the work folder kept only when asked.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.servers import ROOT

Log = Callable[[str], None]


def log(text: str) -> None:
    """Progress, on standard error: standard output is the table."""
    print(text, file=sys.stderr, flush=True)


def run_tool(
    tool: str,
    measure: Callable[[Path, Log], dict[str, Any]],
    *,
    smoke: bool,
    out: Path | None,
    filename: str,
    table: Callable[[dict[str, Any]], str],
    keep_work: bool,
    kept: str,
) -> int:
    """Run ``measure(work, log)``, add ``machine`` and ``wall_seconds`` to what it returns, write it as ``filename``
    and print ``table`` of it. ``kept`` names what the work folder holds (said where it stays)."""
    out = out or (Path(tempfile.mkdtemp(prefix="bench-smoke-")) if smoke else ROOT / "bench" / "results")
    work = Path(tempfile.mkdtemp(prefix="bench-work-"))
    started = time.perf_counter()
    loadavg = list(os.getloadavg())
    try:
        result = measure(work, log)
    except BaseException:
        log(f"[{tool}] failed; {kept} are in {work}")
        raise
    result["machine"] = {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "loadavg_start": loadavg,
        "loadavg_end": list(os.getloadavg()),
    }
    result["wall_seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    end = result["machine"]["loadavg_end"][0]
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"\nresults: {shown}  wall {result['wall_seconds']:.0f}s  load average {loadavg[0]:.2f} -> {end:.2f}")
    if keep_work:
        print(f"{kept}: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo has it."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"
