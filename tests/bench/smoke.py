"""What the smoke tests of ``bench/`` share: running one of its commands at toy sizes, and the one check they
make of a figure (finite and positive: a smoke run on a shared machine measures nothing)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_smoke(module: str, out: Path) -> str:
    """``python -m <module> --smoke --out <out>`` from the repository root; its stdout, once it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0
