"""The load generator: a separate process that drives one server over loopback and prints JSON.

It runs in its own process so its CPU time never hides inside the server's numbers. Every loop is
bounded twice, by a request count and by a deadline, so a stuck server cannot hang the benchmark.

    python -m bench.loadgen closed --port P --spec FILE --concurrency 32 --warmup 1.5 --window 8
    python -m bench.loadgen fairness --port P --small FILE --big FILE --alone 40
    python -m bench.loadgen two_keys --port P --small FILE --flood FILE --quiet-key K1 --flood-key K2 --concurrency 32
    python -m bench.loadgen flood --port P --spec FILE --key K --concurrency 32   (until its stdin ends)
    python -m bench.loadgen abort --port P --spec FILE --after-batches 3
    python -m bench.loadgen single --port P --spec FILE
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cpu import Reading
from bench.http1 import Connection, encode_request, get
from bench.promtext import Snapshot
from bench.stats import summary, summary_ms

# How long requests still in flight at the end of a window may take to come back.
DRAIN_S = 60.0


def load_spec(path: str, key: str | None = None) -> tuple[str, list[bytes]]:
    spec = json.loads(Path(path).read_text())
    return spec["path"], [encode_request("POST", spec["path"], json.dumps(b).encode(), key) for b in spec["bodies"]]


def model_items(path: str) -> int:
    """Texts the model runs for the spec's first rerank body: the query and each distinct document."""
    body = json.loads(Path(path).read_text())["bodies"][0]
    return len({body["query"], *body["documents"]})


async def scrape(port: int) -> Snapshot:
    status, body = await get(port, "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return Snapshot.parse(body.decode(), time.perf_counter())


@dataclass
class Done:
    start: float
    end: float
    status: int


async def closed(args: argparse.Namespace) -> dict[str, Any]:
    """Closed loop: ``concurrency`` connections, each sends its next request when the last returns.

    Only requests that complete inside [t0, t1] count, and the server's own counters and CPU clock are
    read at t0 and t1, so the figure is the steady state with the server kept busy the whole window.
    t1 is ``--window`` after t0, later if fewer than ``--min-completed`` requests completed by then
    (a slow machine must not yield an empty window), and never past the hard deadline.
    """
    _, requests = load_spec(args.spec)
    connections = [Connection(args.port) for _ in range(args.concurrency)]
    done: list[Done] = []
    sent = 0
    begin = time.perf_counter()
    t0, t1 = begin + args.warmup, begin + args.warmup + args.window
    over = asyncio.Event()
    ended_at = t1
    in_window = 0

    def maybe_end() -> None:
        nonlocal ended_at
        now = time.perf_counter()
        if not over.is_set() and now >= t1 and in_window >= args.min_completed:
            ended_at = now
            over.set()

    async def loop(index: int, connection: Connection) -> None:
        nonlocal sent, in_window
        k = index
        while sent < args.max_requests and not over.is_set():
            sent += 1
            raw = requests[k % len(requests)]
            k += args.concurrency
            start = time.perf_counter()
            status, _ = await connection.request(raw)
            end = time.perf_counter()
            done.append(Done(start, end, status))
            if end >= t0 and not over.is_set():
                in_window += 1
            maybe_end()

    async def at_edges() -> tuple[Reading, Reading, Snapshot | None, Snapshot | None]:
        await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        first = await scrape(args.port) if args.metrics else None
        cpu_first = Reading.take(args.pid, args.tree)
        await asyncio.sleep(max(0.0, t1 - time.perf_counter()))
        maybe_end()
        await over.wait()
        cpu_last = Reading.take(args.pid, args.tree)
        return cpu_first, cpu_last, first, await scrape(args.port) if args.metrics else None

    async def all_loops() -> None:
        await asyncio.gather(*(loop(i, c) for i, c in enumerate(connections)))
        if not over.is_set():  # the request budget ran out first
            nonlocal ended_at
            ended_at = max((d.end for d in done), default=time.perf_counter())
            over.set()

    edges = asyncio.create_task(at_edges())
    await asyncio.wait_for(all_loops(), timeout=args.warmup + args.window + DRAIN_S)
    cpu_first, cpu_last, first, last = await edges
    for connection in connections:
        connection.close()
    inside = [d for d in done if t0 <= d.end <= ended_at]
    window = max(ended_at - t0, 1e-9)
    result: dict[str, Any] = {
        "concurrency": args.concurrency,
        "window_s": window,
        "completed": len(inside),
        "rps": len(inside) / window,
        "latency_ms": summary_ms([d.end - d.start for d in inside]),
        "statuses": dict(Counter(str(d.status) for d in done)),
        "sent": sent,
        "cpu": cpu_last.minus(cpu_first),
    }
    if first is not None and last is not None:
        delta = last.minus(first)
        result["metrics"] = delta
        result["server_items_per_s"] = delta["batch_items"] / max(delta["seconds"], 1e-9)
    return result


async def probe(port: int, raw: bytes, count: int, until: float, stop: asyncio.Event | None) -> list[float]:
    """Sequential requests on one connection; their latencies in seconds."""
    connection = Connection(port)
    latencies: list[float] = []
    try:
        for _ in range(count):
            if time.perf_counter() > until or (stop is not None and stop.is_set()):
                break
            start = time.perf_counter()
            status, _ = await connection.request(raw)
            if status != 200:
                raise RuntimeError(f"probe answered {status}")
            if stop is None or not stop.is_set():
                latencies.append(time.perf_counter() - start)
    finally:
        connection.close()
    return latencies


async def wait_batches(port: int, start: Snapshot, batches: float, limit_s: float) -> Snapshot:
    """Poll /metrics until ``batches`` more batches ran than in ``start``; the last snapshot."""
    deadline = time.perf_counter() + limit_s
    while True:
        now = await scrape(port)
        if now.batches >= start.batches + batches or time.perf_counter() > deadline:
            return now
        await asyncio.sleep(0.01)


async def probe_counting_batches(
    port: int, raw: bytes, until: float, stop: asyncio.Event
) -> tuple[list[float], list[float]]:
    """Sequential probes, each between two /metrics scrapes: latencies, and batches each one spanned."""
    connection = Connection(port)
    latencies: list[float] = []
    spanned: list[float] = []
    try:
        while time.perf_counter() < until and not stop.is_set():
            before = await scrape(port)
            start = time.perf_counter()
            status, _ = await connection.request(raw)
            latency = time.perf_counter() - start
            after = await scrape(port)
            if status != 200:
                raise RuntimeError(f"probe answered {status}")
            if not stop.is_set():
                latencies.append(latency)
                spanned.append(after.batches - before.batches)
    finally:
        connection.close()
    return latencies, spanned


async def fairness(args: argparse.Namespace) -> dict[str, Any]:
    """Small-request latency alone, then while one huge request runs (from its first batch on), then alone.

    Probing stops when the huge request completes or after ``--probe-seconds``; then its client hangs
    up, so the huge request's remaining work is dropped rather than waited for.
    """
    _, small = load_spec(args.small)
    _, big = load_spec(args.big)
    await probe(args.port, small[0], 3, time.perf_counter() + 30, None)  # warm-up
    alone = await probe(args.port, small[0], args.alone, time.perf_counter() + args.timeout, None)
    before = await scrape(args.port)
    big_done = asyncio.Event()
    big_connection = Connection(args.port)

    async def run_big() -> int:
        status, _ = await big_connection.request(big[0])
        big_done.set()
        return status

    started = time.perf_counter()
    big_task = asyncio.create_task(run_big())
    first = await wait_batches(args.port, before, 1, args.timeout)
    cpu_first = Reading.take(args.pid)
    # The huge request's own pace over a window of time, to see what the probes then cost it. Time, not a count
    # of batches: with several model threads, batches that started together end together, so a few batches
    # counted from the first one's end would take far less than their share of time.
    await asyncio.sleep(args.big_alone_s)
    alone_mark = await scrape(args.port)
    cpu_alone_mark = Reading.take(args.pid)
    big_alone = alone_mark.minus(first)
    loaded, spanned = await probe_counting_batches(
        args.port, small[0], time.perf_counter() + args.probe_seconds, big_done
    )
    last = await scrape(args.port)
    probed = Reading.take(args.pid).minus(cpu_alone_mark)
    completed = big_done.is_set()
    if not completed:
        big_task.cancel()
        big_connection.close()
        with contextlib.suppress(asyncio.CancelledError):
            await big_task
        await settle(args.port, quiet_s=0.3, limit_s=args.timeout)
    else:
        big_connection.close()
    after = await probe(args.port, small[0], args.alone, time.perf_counter() + args.timeout, None)
    during = last.minus(alone_mark)
    probe_items = model_items(args.small)
    big_items_during = during["batch_items"] - probe_items * len(loaded)
    return {
        "alone_ms": summary_ms(alone),
        "alone_after_ms": summary_ms(after),
        "loaded_ms": summary_ms(loaded),
        "batches_spanned": summary(spanned),
        "batch_ms": 1000 * during["seconds"] / max(during["batches"], 1),
        "batch_items": during["batch_items"] / max(during["batches"], 1),
        "big_items_per_s_alone": big_alone["batch_items"] / max(big_alone["seconds"], 1e-9),
        "big_items_per_s_probed": big_items_during / max(during["seconds"], 1e-9),
        "big_completed": completed,
        "big_s": time.perf_counter() - started,
        "probed_s": during["seconds"],
        # Cores the server kept busy (server CPU seconds per second; 0 without --pid): the huge request alone,
        # and the huge request with the probes.
        "big_alone_cores": _cores(cpu_alone_mark.minus(cpu_first)),
        "probed_cores": _cores(probed),
        # This load generator's own, on the same machine: the probes' client and its /metrics scrapes.
        "probed_client_cores": _cores(probed, "own_cpu_s"),
    }


async def flood(port: int, requests: list[bytes], concurrency: int, stop: asyncio.Event) -> int:
    """``concurrency`` connections, each sending its next request as the last returns, until ``stop`` (each ends
    with the request it has in flight); how many were answered."""
    answered = 0

    async def loop(index: int) -> None:
        nonlocal answered
        connection, k = Connection(port), index
        try:
            while not stop.is_set():
                status, _ = await connection.request(requests[k % len(requests)])
                if status != 200:
                    raise RuntimeError(f"the flood was answered {status}")
                answered, k = answered + 1, k + concurrency
        finally:
            connection.close()

    await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return answered


async def flood_until_told(args: argparse.Namespace) -> dict[str, Any]:
    """The ``flood`` command: ``--concurrency`` connections in closed loops with ``--key``, until this process's
    standard input ends (its parent closes it); how many were answered."""
    _, requests = load_spec(args.spec, args.key)
    stop = asyncio.Event()
    loop, fd = asyncio.get_running_loop(), sys.stdin.fileno()

    def told() -> None:
        if not os.read(fd, 4096):
            loop.remove_reader(fd)
            stop.set()

    loop.add_reader(fd, told)
    return {"answered": await flood(args.port, requests, args.concurrency, stop)}


class Flood:
    """Another key's flood beside the probes: in a client process of its own (``separate``), as another client's
    would be, so the probes' timings never wait on the flood's responses in this process's event loop; or as
    tasks of this process, as before (what the probes' client then also does is in their timings)."""

    def __init__(self, args: argparse.Namespace, *, separate: bool) -> None:
        self._args, self._separate = args, separate
        self._task: asyncio.Task[int] | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        args = self._args
        if not self._separate:
            _, flooding = load_spec(args.flood, args.flood_key)
            self._task = asyncio.create_task(flood(args.port, flooding, args.concurrency, self._stop))
            return
        command = ["-m", "bench.loadgen", "flood", "--port", str(args.port), "--spec", args.flood]
        command += ["--key", args.flood_key, "--concurrency", str(args.concurrency)]
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )

    async def stop(self) -> int:
        """Stop it; the requests it had answered."""
        if self._task is not None:
            self._stop.set()
            return await asyncio.wait_for(self._task, timeout=self._args.timeout)
        process = self._process
        assert process is not None and process.stdin is not None
        process.stdin.close()
        out, _ = await asyncio.wait_for(process.communicate(), timeout=self._args.timeout)
        if process.returncode != 0:
            raise RuntimeError(f"the flood's process exited {process.returncode}")
        answered: int = json.loads(out)["answered"]
        return answered


async def two_keys(args: argparse.Namespace) -> dict[str, Any]:
    """One key's 1-document probes alone; then beside another key's flood (``--concurrency`` connections in closed
    loops, from a client process of its own unless ``--flood-in-process``), with the quiet key's own credentials;
    then, still beside the flood, with the flooding key's (the control: one key, so no fair share between the
    probes and the flood); then alone again."""
    _, quiet = load_spec(args.small, args.quiet_key)
    _, same = load_spec(args.small, args.flood_key)
    await probe(args.port, quiet[0], 3, time.perf_counter() + 30, None)  # warm-up
    alone = await probe(args.port, quiet[0], args.alone, time.perf_counter() + args.timeout, None)
    flooding = Flood(args, separate=not args.flood_in_process)
    await flooding.start()
    await asyncio.sleep(args.flood_warmup_s)
    started = await scrape(args.port)
    loaded = await probe(args.port, quiet[0], 1_000_000, time.perf_counter() + args.probe_seconds, None)
    control = await probe(args.port, same[0], 1_000_000, time.perf_counter() + args.probe_seconds, None)
    during = (await scrape(args.port)).minus(started)
    answered = await flooding.stop()
    await settle(args.port, quiet_s=0.3, limit_s=args.timeout)
    after = await probe(args.port, quiet[0], args.alone, time.perf_counter() + args.timeout, None)
    return {
        "alone_ms": summary_ms(alone),
        "alone_after_ms": summary_ms(after),
        "alone_pooled_ms": summary_ms(alone + after),
        "loaded_ms": summary_ms(loaded),
        "same_key_ms": summary_ms(control),
        "flood_answered": answered,
        "flood_items_per_s": during["batch_items"] / max(during["seconds"], 1e-9),
        "batch_items": during["batch_items"] / max(during["batches"], 1),
    }


def _cores(cpu: dict[str, float], key: str = "server_cpu_s") -> float:
    return cpu[key] / max(cpu["wall_s"], 1e-9)


async def settle(port: int, quiet_s: float, limit_s: float) -> Snapshot:
    """Wait until nothing is queued or in flight on /rerank and no batch ran for ``quiet_s``."""
    deadline = time.perf_counter() + limit_s
    last = await scrape(port)
    quiet_since = last.at
    while time.perf_counter() < deadline:
        await asyncio.sleep(0.02)
        now = await scrape(port)
        if now.batches != last.batches or now.queue_depth or now.route_load:
            quiet_since = now.at
        last = now
        if now.at - quiet_since >= quiet_s:
            break
    return last


async def abort(args: argparse.Namespace) -> dict[str, Any]:
    """Send one big rerank, hang up after a few batches ran, then count what the model still ran."""
    _, requests = load_spec(args.spec)
    start = await scrape(args.port)
    connection = Connection(args.port)
    await connection.send(requests[0])
    at_close = await wait_batches(args.port, start, args.after_batches, args.timeout)
    connection.close()  # right after the scrape: the two are a millisecond apart
    running = at_close.minus(start)
    batch_period = running["seconds"] / max(running["batches"], 1)
    settled = await settle(args.port, quiet_s=max(0.3, 2 * batch_period), limit_s=args.timeout)
    return {
        "before_close": running,
        "after_close": settled.minus(at_close),
        "batch_period_s": batch_period,
        "route_load_after": settled.route_load,
        "queue_depth_after": settled.queue_depth,
    }


async def single(args: argparse.Namespace) -> dict[str, Any]:
    _, requests = load_spec(args.spec)
    connection = Connection(args.port)
    start = time.perf_counter()
    status, body = await asyncio.wait_for(connection.request(requests[0]), timeout=args.timeout)
    seconds = time.perf_counter() - start
    connection.close()
    return {"status": status, "seconds": seconds, "response_bytes": len(body)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("closed", "fairness", "two_keys", "flood", "abort", "single"):
        sub = commands.add_parser(name)
        sub.add_argument("--port", type=int, required=True)
        sub.add_argument("--timeout", type=float, default=120.0)
        if name not in ("fairness", "two_keys"):
            sub.add_argument("--spec", required=True)
    closed_cmd = commands.choices["closed"]
    closed_cmd.add_argument("--concurrency", type=int, default=1)
    closed_cmd.add_argument("--warmup", type=float, default=1.0)
    closed_cmd.add_argument("--window", type=float, default=5.0)
    closed_cmd.add_argument("--max-requests", type=int, default=100_000)
    closed_cmd.add_argument("--min-completed", type=int, default=1)
    closed_cmd.add_argument("--metrics", action="store_true", help="scrape scorekit /metrics at the edges")
    closed_cmd.add_argument("--pid", type=int, help="the server's pid, to read its CPU time at the edges")
    closed_cmd.add_argument("--tree", action="store_true", help="count the server's child processes' CPU as its own")
    fair = commands.choices["fairness"]
    fair.add_argument("--small", required=True)
    fair.add_argument("--big", required=True)
    fair.add_argument("--alone", type=int, default=40)
    fair.add_argument("--probe-seconds", type=float, default=15.0)
    fair.add_argument("--big-alone-s", type=float, default=2.0, help="seconds the huge request runs alone")
    fair.add_argument("--pid", type=int, help="the server's pid, to read its CPU time in each phase")
    keys = commands.choices["two_keys"]
    keys.add_argument("--small", required=True, help="the quiet key's probe")
    keys.add_argument("--flood", required=True, help="the flooding key's requests, sent round-robin")
    keys.add_argument("--quiet-key", required=True)
    keys.add_argument("--flood-key", required=True)
    keys.add_argument("--concurrency", type=int, default=32, help="the flood's connections")
    keys.add_argument("--alone", type=int, default=40)
    keys.add_argument("--probe-seconds", type=float, default=15.0, help="each of the two loaded probe phases")
    keys.add_argument("--flood-warmup-s", type=float, default=1.0)
    keys.add_argument(
        "--flood-in-process",
        action="store_true",
        help="flood from this process's loop, not a client process of its own",
    )
    flood_cmd = commands.choices["flood"]
    flood_cmd.add_argument("--key", required=True)
    flood_cmd.add_argument("--concurrency", type=int, default=32)
    commands.choices["abort"].add_argument("--after-batches", type=int, default=3)
    return parser


COMMANDS = {
    "closed": closed,
    "fairness": fairness,
    "two_keys": two_keys,
    "flood": flood_until_told,
    "abort": abort,
    "single": single,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = asyncio.run(COMMANDS[args.command](args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
