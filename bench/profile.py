"""Profile a server under a benchmark's load with py-spy, and summarise where its CPU samples went.

    python -m bench.profile lifecycle   # the trivial stack with LifecycleMiddleware (overhead miss)
    python -m bench.profile router      # the same stack without it, for comparison
    python -m bench.profile scorekit    # `scorekit serve`, 16-document reranks at concurrency 32
    python -m bench.profile naive       # the naive server under the same load
    python -m bench.profile fairness    # `scorekit serve`: 1-document probes beside a 5,000-document rerank

py-spy samples the server's threads from outside (no code change, no slowdown of the measured
process); the summary groups samples per thread and by the layer of the innermost frame, and
lists the hottest functions. It is written to bench/results/profile-<target>.txt.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench.corpus import documents, queries, rerank_body, rerank_set, trivial_body
from bench.driver import write_spec
from bench.servers import ROOT, Server, child_env, running, spawn_scorekit, spawn_uvicorn

# The innermost frame whose file matches decides a sample's layer (first match wins, leaf first).
LAYERS: tuple[tuple[str, str], ...] = (
    ("torch", "torch/"),
    ("tokenizer", "tokenizers/"),
    ("tokenizer", "transformers/tokenization"),
    ("model code (transformers, Python)", "transformers/"),
    ("router + endpoint", "scorekit/routing.py"),
    ("router + endpoint", "scorekit/api/"),
    ("router + endpoint", "bench/apps.py"),
    ("lifecycle middleware", "scorekit/lifecycle.py"),
    ("anyio (lifecycle's task group, events)", "anyio/"),
    ("engine / batcher / worker", "scorekit/"),
    ("naive server", "bench/naive.py"),
    ("starlette / fastapi", "starlette/"),
    ("starlette / fastapi", "fastapi/"),
    ("json / msgspec / prometheus", "msgspec"),
    ("json / msgspec / prometheus", "json/"),
    ("json / msgspec / prometheus", "prometheus_client/"),
    ("h11 parser", "h11/"),
    ("uvicorn", "uvicorn/"),
    ("threading", "threading.py"),
)
# Frames every sample shares (the interpreter, uvicorn's start-up, the loop's run methods): not listed.
_ROOTS = (
    "click/",
    "<frozen runpy>",
    "uvicorn/main.py",
    "uvicorn/__main__.py",
    "uvicorn/_compat.py",
    "uvicorn/server.py",
    "scorekit/cli/",
    "asyncio/runners.py",
    "asyncio/base_events.py",
    "asyncio/events.py",
    "threading.py",
)
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _layer(frames: list[str]) -> str:
    """The innermost frame's layer; asyncio's own helpers count for whoever called them."""
    for frame in reversed(frames):
        if "asyncio/events.py" in frame or "asyncio/base_events.py" in frame:
            return "asyncio event loop"  # reached the loop with no owner below it
        if "asyncio/" in frame:
            continue
        for name, pattern in LAYERS:
            if pattern in frame:
                return name
    return "other"


def _function(frame: str) -> str:
    match = _FRAME.match(frame)
    return f"{match['func']} ({match['file']})" if match else frame


def summarise(raw: str, top: int = 12) -> str:
    """Samples per thread, self samples by layer, and the hottest functions by inclusive samples."""
    threads: Counter[str] = Counter()
    layers: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        thread = re.sub(r"[_ ]\d+.*$", "", thread) or thread  # pool threads: one group per pool
        threads[thread] += count
        layers[thread][_layer(frames[1:])] += count
        for function in {_function(f) for f in frames[1:] if not any(root in f for root in _ROOTS)}:
            inclusive[thread][function] += count
    total = sum(threads.values()) or 1
    out = [f"{total} samples of CPU (idle threads not sampled)", ""]
    for thread, n in threads.most_common():
        out.append(f"== thread {thread}: {n} samples ({100 * n / total:.0f}% of all)")
        out.append("   self samples by layer of the innermost frame:")
        for layer, k in layers[thread].most_common():
            out.append(f"     {100 * k / n:5.1f}%  {layer}")
        out.append("   hottest functions (inclusive):")
        for function, k in inclusive[thread].most_common(top):
            out.append(f"     {100 * k / n:5.1f}%  {function}")
        out.append("")
    return "\n".join(out)


def _load(target: str, server: Server, work: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Start the load generator for ``target``; it runs a little longer than the recording."""
    args: list[object]
    if target in ("lifecycle", "router"):
        spec = write_spec(work, "trivial", "/score", [trivial_body()])
        args = ["closed", "--spec", spec, "--concurrency", 32, "--warmup", 0.3, "--window", seconds + 1]
    elif target == "fairness":
        small = write_spec(work, "small", "/rerank", [rerank_body(queries(1, 21)[0], documents(1, 21))])
        big = write_spec(work, "big", "/rerank", [rerank_body(queries(1, 22)[0], documents(5000, 22))])
        args = ["fairness", "--small", small, "--big", big, "--alone", 5, "--probe-seconds", seconds + 1]
    else:
        spec = write_spec(work, "rerank", "/rerank", rerank_set(64, 16).bodies)
        args = ["closed", "--spec", spec, "--concurrency", 32, "--warmup", 1.0, "--window", seconds + 1]
    if args[0] == "closed":
        args += ["--pid", server.pid]
    argv = [sys.executable, "-m", "bench.loadgen", str(args[0]), "--port", str(server.port), *map(str, args[1:])]
    return subprocess.Popen(argv, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE)


def py_spy() -> str | None:
    """py-spy from the bench extra: beside this interpreter (``make bench`` does not put the venv on PATH), or on
    PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def profile(target: str, seconds: float, out: Path, spy: str) -> Path:
    work = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    if target == "lifecycle":
        server = spawn_uvicorn("lifecycle", "bench.apps:scorekit_full", work)
    elif target == "router":
        server = spawn_uvicorn("router", "bench.apps:scorekit_router", work)
    elif target == "naive":
        server = spawn_uvicorn("naive", "bench.naive:create_app", work)
    else:
        server = spawn_scorekit("scorekit", work)
    with running(server):
        load = _load(target, server, work, seconds)
        time.sleep(3.0 if target == "fairness" else 1.5)  # past the warm-up (fairness: into the big request)
        raw = work / "raw.txt"
        command = [spy, "record", "-p", str(server.pid), "-d", str(int(seconds)), "-r", "100"]
        subprocess.run([*command, "-f", "raw", "-o", str(raw), "--threads"], check=True, capture_output=True)
        stdout, _ = load.communicate(timeout=600)
    result = json.loads(stdout) if stdout.strip() else {}
    path = out / f"profile-{target}.txt"
    header = f"py-spy record of {' '.join(server.args[1:4])} ... under the {target} load for {seconds:.0f}s\n"
    path.write_text(header + summarise(raw.read_text()) + "\nload generator: " + json.dumps(result)[:600] + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("target", choices=["lifecycle", "router", "scorekit", "naive", "fairness"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    spy = py_spy()
    if spy is None:
        parser.error("py-spy is not installed: make install EXTRAS=test,bench")
    args.out.mkdir(parents=True, exist_ok=True)
    path = profile(args.target, args.seconds, args.out, spy)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
