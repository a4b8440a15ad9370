"""Framework overhead: requests/s of a trivial scoring function through each stack under uvicorn.

All five apps run at once (each in its own uvicorn process, started with the model servers) and are
measured in alternating order over several rounds; each app keeps its best round, since a shared
machine only ever slows a round down. Two forms: requests/s, and the server's CPU microseconds per
request (what the targets use: other jobs stretch wall time, not CPU per request). The same apps
are also timed in-process (bench.asgi_direct), which takes uvicorn's HTTP parsing out of the figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.apps import FACTORIES
from bench.asgi_direct import microseconds_per_request
from bench.context import Context
from bench.corpus import trivial_body
from bench.driver import write_spec
from bench.servers import Server, spawn_uvicorn


def spawn(work: Path) -> dict[str, Server]:
    """One uvicorn process per app, keyed ``app:<name>``; the harness starts them with the others."""
    return {f"app:{name}": spawn_uvicorn(name, f"bench.apps:{f.__name__}", work) for name, f in FACTORIES.items()}


def run(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    spec = write_spec(ctx.work, "trivial", "/score", [trivial_body()])
    servers = [ctx.servers[f"app:{name}"] for name in FACTORIES]
    rounds: dict[str, list[float]] = {name: [] for name in FACTORIES}
    cpu_us: dict[str, list[float]] = {name: [] for name in FACTORIES}
    latency: dict[str, dict[str, float]] = {}
    for index in range(p.overhead_rounds):
        for server in servers if index % 2 == 0 else servers[::-1]:
            window = ctx.closed(
                server, spec, p.overhead_concurrency, warmup=p.overhead_warmup_s, window=p.overhead_window_s
            )
            if window["statuses"].keys() != {"200"} or not window["completed"]:
                raise RuntimeError(f"{server.name}: {window['completed']} in the window, {window['statuses']}")
            rounds[server.name].append(window["rps"])
            cpu_us[server.name].append(1e6 * window["cpu"]["server_cpu_s"] / window["completed"])
            if window["rps"] >= max(rounds[server.name]):
                latency[server.name] = window["latency_ms"]
    rps = {name: max(values) for name, values in rounds.items()}
    cpu = {name: min(values) for name, values in cpu_us.items()}
    inproc = microseconds_per_request(p.inproc_requests, p.inproc_repeats)
    return {
        "concurrency": p.overhead_concurrency,
        "http_rps": rps,
        "http_rounds": rounds,
        "http_latency_ms": latency,
        "http_cpu_us_per_request": cpu,
        "http_cpu_rounds": cpu_us,
        "inproc_us_per_request": inproc,
        "scorekit_over_starlette_wall": rps["scorekit"] / rps["starlette"],
        "scorekit_over_fastapi_wall": rps["scorekit"] / rps["fastapi"],
        "middleware_cost_wall": rps["scorekit_router"] / rps["scorekit"] - 1,
        # Server CPU per request: the forms that hold still on a shared machine (the targets use these).
        "scorekit_over_starlette": cpu["starlette"] / cpu["scorekit"],
        "scorekit_over_fastapi": cpu["fastapi"] / cpu["scorekit"],
        "middleware_cost": cpu["scorekit"] / cpu["scorekit_router"] - 1,
        "metrics_cost": cpu["scorekit_metrics"] / cpu["scorekit"] - 1,
        "inproc_middleware_cost": inproc["scorekit"] / inproc["scorekit_router"] - 1,
        "inproc_scorekit_over_fastapi": inproc["fastapi"] / inproc["scorekit"],
    }
