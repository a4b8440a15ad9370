"""Run the load generator as a child process and read its JSON; write the request specs it reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.corpus import dump
from bench.servers import ROOT, child_env


def write_spec(folder: Path, name: str, path: str, bodies: list[dict[str, object]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / f"{name}.json"
    spec.write_text(dump(path, bodies))
    return spec


def loadgen(command: str, port: int, *args: object, timeout: float = 300.0) -> dict[str, Any]:
    """``python -m bench.loadgen <command> --port P ...``; its stdout is one JSON object."""
    argv = [sys.executable, "-m", "bench.loadgen", command, "--port", str(port), *map(str, args)]
    done = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {command} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result
