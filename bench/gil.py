"""``python -m bench.gil``: how much a model's forward slows down while another thread runs Python.

In a server the worker thread's forward shares the interpreter lock with the event loop. An eager forward gives
the lock up around every operator it launches and must win it back each time; while the loop runs Python, each
win can wait up to the switch interval (5 ms). On a GPU, where an operator's launch takes microseconds, that
wait can dominate a forward. This measures it without a server: the backend's ``forward`` on one batch, alone and
beside a thread that only runs Python, in eager mode and as a TorchScript trace (which runs its whole graph
without the lock), and the CPU cores the process used while the forward ran alone (a GPU forward that waits for
the device by spinning shows about one).

    python -m bench.gil --device cuda --dtype float16 --models minilm,base,large
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.corpus import rerank_set
from bench.gpu import DOCS, MODELS, ceiling, model_folder
from scorekit.models.padding import pad_batch


def rate(forward: Callable[[], object], seconds: float) -> tuple[float, float]:
    """Forwards per wall second, and the process's CPU cores meanwhile."""
    forward()
    started, cpu, calls = time.perf_counter(), time.process_time(), 0
    while calls < 3 or time.perf_counter() - started < seconds:
        forward()
        calls += 1
    wall = time.perf_counter() - started
    return calls / wall, (time.process_time() - cpu) / wall


def beside_python(forward: Callable[[], object], seconds: float) -> float:
    """Forwards per wall second while another thread runs a Python loop."""
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        return rate(forward, seconds)[0]
    finally:
        stop.set()
        thread.join()


def first(output: Any) -> torch.Tensor:
    """The first output of an eager call (a ModelOutput) or of a trace (a dict)."""
    value = next(iter(output.values())) if isinstance(output, dict) else output[0]
    assert isinstance(value, torch.Tensor)
    return value


def measure(folder: str, name: str, args: argparse.Namespace) -> str:
    """One table row: eager and traced, alone and beside a Python thread."""
    raw = ceiling(folder, rerank_set(64, DOCS).texts, args.device, args.dtype)
    batch = raw.inputs[: args.batch]
    model = raw.backend._model  # type: ignore[attr-defined]
    device = torch.device(args.device)
    inputs = pad_batch(batch, 0, device)
    # The longest and the shortest input: a padded sample, so the trace keeps the attention mask's path.
    longest, shortest = max(batch, key=lambda item: item.cost), min(batch, key=lambda item: item.cost)
    traced = torch.jit.trace(model, example_kwarg_inputs=pad_batch([longest, shortest], 0, device), strict=False)

    def eager() -> torch.Tensor:
        return first(model(**inputs)).float().cpu()

    def script() -> torch.Tensor:
        return first(traced(**inputs)).float().cpu()

    difference = float((eager() - script()).abs().max())
    alone, cores = rate(eager, args.seconds)
    busy = beside_python(eager, args.seconds)
    sys.setswitchinterval(0.0001)
    fine = beside_python(eager, args.seconds)
    sys.setswitchinterval(0.005)
    traced_alone = rate(script, args.seconds)[0]
    traced_busy = beside_python(script, args.seconds)
    alone, busy, fine, traced_alone, traced_busy = (
        args.batch * value for value in (alone, busy, fine, traced_alone, traced_busy)
    )
    return (
        f"| {name} | {alone:.0f} | {busy:.0f} | {fine:.0f} | {traced_alone:.0f} | {traced_busy:.0f} | {cores:.2f} |"
        f" {difference:.1e} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gil", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    print(f"{args.device} {args.dtype}, batch {args.batch}: items per second")
    print(
        "| model | eager alone | eager beside Python | switch 0.1 ms | traced alone | traced beside Python | cores |"
        " max difference |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work, torch.inference_mode():
        for name in args.models.split(","):
            print(measure(model_folder(name, Path(work)), name, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
