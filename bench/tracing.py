"""``python -m bench.tracing [--smoke] [--out DIR] [--rounds N] [--protocol P] [--baseline PATH]``: traces off and on.

Issue 32 asks that traces cost nothing measurable when off, and for the full ``create_app`` stack's cost per request
with them off and on. Each variant runs in processes of its own, all started side by side:

- ``off``: the default (no ``OTEL_*`` variable reaches it);
- ``on``: every request sampled (``OTEL_TRACES_SAMPLER=always_on``), exported by the SDK's BatchSpanProcessor over
  OTLP (``--protocol``: http/protobuf by default, or grpc) to a sink this process runs on loopback, which decodes
  each export to count its spans by name and discards them;
- ``sampled_out``: the same exporter, ``OTEL_TRACES_SAMPLER=always_off`` (each request's span is non-recording, its
  children the shared no-op);
- ``baseline`` (with ``--baseline PATH``, a tree of the code before tracing: ``git archive 9e6c6df | tar -x -C
  PATH``): that tree's ``scorekit`` package, in the same interpreter, with this checkout's ``bench``.

Each process serves two models: the embedded MiniLM (the default) and ``near-free``, bench.model_host's random
1-layer, width-32 cross-encoder, whose forward is a few tiny operators as on a GPU. Three requests:

- ``models``: ``GET /v1/models``, no model at all: the middleware's own share (the request's span and its
  ``encode``); in process only (the load generator sends POSTs);
- ``rerank_near_free``: ``POST /rerank`` of 1 query x 4 short documents on ``near-free``: every span (decode,
  tokenize, queue, batch, encode) around a forward that costs next to nothing;
- ``rerank_minilm``: the same body on MiniLM, over HTTP only: what a user of the default model on a CPU sees.

Two forms, each in CPU time (which other jobs on a shared machine stretch less than wall time) of every thread of
the process, the exporter's included:

- **http**: ``scorekit serve`` per variant under ``bench.loadgen``'s closed loop; the server's CPU microseconds per
  request answered in the window (the exporter works in steady state: a batch goes out each time 512 spans wait);
- **in process**: a worker process per variant enters ``create_app``'s lifespan and drives the app through scripted
  ASGI messages (as ``bench/asgi_direct.py`` does), with no HTTP parsing; its CPU microseconds per request, the
  exporter flushed at both ends of each pass, so a pass counts the export of exactly its own spans. Each pass also
  says what of it the export took (the span processor's thread and the last flush) and the cyclic garbage
  collector (a full collection walks the whole heap, torch's and the models' objects included).

Windows and passes alternate between the variants (the order reversed every other round); each variant keeps its
best round, since a shared machine only ever slows a round down, and its mean, which counts the collector's full
passes that a best round may have missed; each ratio is also given round by round. The run writes ``tracing.json``
to bench/results (``--smoke``: a temporary folder, or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

from bench.corpus import trivial_body
from bench.driver import loadgen, write_spec
from bench.servers import HOST, ROOT, Server, child_env, free_port, running, spawn_command
from bench.standalone import run_tool

NEAR_FREE = "near-free"
# What each request sends: its method, path and JSON body (None: no body).
REQUESTS: dict[str, tuple[str, str, dict[str, object] | None]] = {
    "models": ("GET", "/v1/models", None),
    "rerank_near_free": ("POST", "/rerank", {**trivial_body(), "model": NEAR_FREE}),
    "rerank_minilm": ("POST", "/rerank", trivial_body()),
}
HTTP_REQUESTS = ("rerank_near_free", "rerank_minilm")
TRACED = ("on", "sampled_out")
PROTOCOLS = ("http/protobuf", "grpc")
# (numerator, denominator) of each ratio printed; the last only with a baseline.
RATIOS = (("on", "off"), ("sampled_out", "off"), ("off", "baseline"))
TRACES_PATH = "/v1/traces"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Sizes:
    rounds: int = 3
    concurrency: int = 32
    warmup_s: float = 0.5
    window_s: float = 1.5
    inproc_warmup: int = 50
    inproc_requests: tuple[tuple[str, int], ...] = (("models", 2000), ("rerank_near_free", 400))


FULL = Sizes()
SMOKE = Sizes(
    rounds=1,
    concurrency=4,
    warmup_s=0.2,
    window_s=0.4,
    inproc_warmup=5,
    inproc_requests=(("models", 50), ("rerank_near_free", 20)),
)


class Sink:
    """An OTLP trace receiver on loopback that counts each export's spans by name and keeps nothing else."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.exports = 0
        self.spans: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop: Callable[[], None] = lambda: None
        self.endpoint = ""

    def take(self, request: Any) -> None:
        """Count the spans of one ``ExportTraceServiceRequest``."""
        names = Counter(span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans)
        with self._lock:
            self.exports += 1
            self.spans.update(names)

    @contextlib.contextmanager
    def serving(self) -> Iterator[Sink]:
        start = self._grpc if self.protocol == "grpc" else self._http
        start()
        try:
            yield self
        finally:
            self._stop()

    def _http(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a collector answers the exporter's session

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.take(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)  # an empty ExportTraceServiceResponse: nothing rejected
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer((HOST, 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="otlp-sink", daemon=True)
        thread.start()
        self.endpoint = f"http://{HOST}:{server.server_address[1]}{TRACES_PATH}"

        def stop() -> None:
            server.shutdown()
            server.server_close()

        self._stop = stop

    def _grpc(self) -> None:
        import grpc  # type: ignore[import-untyped]
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        sink = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                sink.take(request)
                return ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
        port = server.add_insecure_port(f"{HOST}:0")
        server.start()
        self.endpoint = f"http://{HOST}:{port}"  # http: the exporter's insecure channel
        self._stop = lambda: server.stop(None)


def variant_env(variant: str, sink: Sink, baseline: Path | None) -> dict[str, str]:
    """What one variant's processes get over this one's environment (which has no ``OTEL_*`` variable left): the
    exporter's variables where traced, and the baseline's ``scorekit`` package first on the path."""
    env: dict[str, str] = {}
    if variant in TRACED:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = sink.endpoint
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = sink.protocol
        env["OTEL_TRACES_SAMPLER"] = "always_on" if variant == "on" else "always_off"
    if variant == "baseline" and baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join((str(baseline), str(ROOT)))
    return env


def python(*args: str) -> list[str]:
    """This interpreter with ``-P``: the working directory (this checkout) is not put first on the path, so a
    baseline's package on PYTHONPATH is the one imported."""
    return [sys.executable, "-P", *args]


def spawn_server(variant: str, env: dict[str, str], near_free: Path, work: Path) -> Server:
    """``scorekit serve`` of MiniLM (first: the default) and ``near_free``, as ``bench.servers.spawn_scorekit``
    starts it (access log off)."""
    from scorekit.models import default_model_path

    port = free_port()
    command = python("-m", "scorekit.cli", "serve", "--host", HOST, "--port", str(port), "--log-level", "warning")
    command += ["--model", default_model_path(), "--model", f"{NEAR_FREE}={near_free}"]
    return spawn_command(variant, command, work, "/health", child_env(env))


def baseline_path(tree: Path, work: Path) -> Path:
    """A folder holding only ``scorekit``, a link to ``tree``'s: first on the path, it shadows this checkout's
    package and no other (``tree`` may be a whole archive, whose ``bench`` lacks this module)."""
    package = tree.resolve() / "scorekit"
    if not (package / "app.py").is_file():
        raise SystemExit(f"--baseline {tree}: no scorekit/app.py there (git archive 9e6c6df | tar -x -C {tree})")
    shim = work / "baseline-path"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "scorekit").symlink_to(package, target_is_directory=True)
    return shim


# -- the in-process form: one worker process per variant ----------------------------------------------------------


def _scope(method: str, path: str, body: bytes | None) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1")]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def _request(app: Any, scope: dict[str, Any], body: bytes | None) -> int:
    """One request as uvicorn delivers it (the body, then ``http.disconnect`` once the answer is done); its status."""
    complete = asyncio.Event()
    delivered = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        await complete.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            complete.set()

    await app(dict(scope), receive, send)
    return status


async def _worker_passes(commands: IO[str], answers: IO[str], near_free: str, package: str) -> None:
    """Serve MiniLM and the ``near_free`` folder; say ``package`` once the app is ready, then serve the pass
    commands read from ``commands`` (one JSON line each) until it ends, one answer line each."""
    from scorekit.app import create_app
    from scorekit.settings import ModelSpec, Settings

    app = create_app(Settings(models=(ModelSpec(), ModelSpec(path=near_free, name=NEAR_FREE))))
    tracer = getattr(app, "tracing", None)  # None: tracing off, or the code before tracing

    def flush() -> float:
        """Export every span ended so far, in this thread; the CPU seconds it took."""
        started = time.thread_time()
        if tracer is not None:
            tracer.flush()
        return time.thread_time() - started

    collector = Collections()
    gc.callbacks.append(collector.callback)
    async with app.lifespan():
        loop = asyncio.get_running_loop()
        answers.write(json.dumps({"package": package}) + "\n")
        answers.flush()
        while line := await loop.run_in_executor(None, commands.readline):
            command = json.loads(line)
            method, path, payload = REQUESTS[command["request"]]
            body = None if payload is None else json.dumps(payload).encode()
            scope = _scope(method, path, body)
            statuses: Counter[int] = Counter()
            for _ in range(command["warmup"]):
                statuses[await _request(app, scope, body)] += 1
            flush()
            exporting = exporter_cpu_s()
            collector.clear()
            started = time.process_time()
            for _ in range(command["requests"]):
                statuses[await _request(app, scope, body)] += 1
            last = flush()  # the pass's last spans exported inside it
            cpu = time.process_time() - started
            export = exporter_cpu_s() - exporting + last
            answer = {
                "cpu_us": 1e6 * cpu / command["requests"],
                "export_us": 1e6 * export / command["requests"],
                **collector.figures(command["requests"]),
                "statuses": {str(k): v for k, v in statuses.items()},
            }
            answers.write(json.dumps(answer) + "\n")
            answers.flush()


class Collections:
    """The cyclic garbage collector's passes over a pass of requests: how many of each generation, and their CPU."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.cpu_s = 0.0
        self._started = 0.0

    def clear(self) -> None:
        self.counts = [0, 0, 0]
        self.cpu_s = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.counts[info["generation"]] += 1
            self.cpu_s += time.thread_time() - self._started

    def figures(self, requests: int) -> dict[str, Any]:
        return {"gc_us": 1e6 * self.cpu_s / requests, "gc_collections": list(self.counts)}


def exporter_cpu_s() -> float:
    """CPU seconds of the span processor's thread (the SDK's ``OtelBatchSpanRecordProcessor``, which encodes and
    sends the batches; none when off), from /proc in clock ticks."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("OtelBatch") and thread.native_id is not None:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


@dataclass
class Worker:
    variant: str
    process: subprocess.Popen[str]

    @classmethod
    def spawn(cls, variant: str, env: dict[str, str], near_free: Path, log: Path) -> Worker:
        with log.open("w") as handle:
            process = subprocess.Popen(
                python("-m", "bench.tracing", "--worker", str(near_free)),
                cwd=ROOT,
                env=child_env(env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=handle,
                text=True,
            )
        return cls(variant, process)

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.variant} worker exited with {self.process.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def wait_ready(self) -> str:
        """Once its model is loaded and warmed up: the folder its ``scorekit`` was imported from."""
        package: str = self._answer()["package"]
        return package

    def run(self, request: str, warmup: int, requests: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"request": request, "warmup": warmup, "requests": requests}) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        if set(answer["statuses"]) != {"200"}:
            raise RuntimeError(f"{self.variant} {request} in process: {answer['statuses']}")
        return answer

    def close(self) -> None:
        """End its input: it leaves the lifespan (the last spans flushed) and exits."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()

    def stop(self) -> None:
        self.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


# -- the run --------------------------------------------------------------------------------------------------------


def window(server: Server, spec: Path, sizes: Sizes) -> dict[str, Any]:
    """One closed-loop window against ``server``: its CPU per request answered, and what else the window saw."""
    args: list[object] = ["--spec", spec, "--concurrency", sizes.concurrency, "--warmup", sizes.warmup_s]
    args += ["--window", sizes.window_s, "--max-requests", 1_000_000, "--min-completed", 2, "--pid", server.pid]
    result = loadgen("closed", server.port, *args, "--metrics")
    if result["statuses"].keys() != {"200"}:
        raise RuntimeError(f"{server.name}: {result['statuses']}")
    cpu, metrics = result["cpu"], result["metrics"]
    return {
        "cpu_us": 1e6 * cpu["server_cpu_s"] / result["completed"],
        # A traced request's batch span links every traced request in its batch: the more, the more links.
        "mean_batch_items": metrics["batch_items"] / max(metrics["batches"], 1),
        "rps": result["rps"],
        "completed": result["completed"],
        "sent": result["sent"],
        "other_cores": cpu["other_cores"],
        "loadgen_cores": cpu["own_cpu_s"] / cpu["wall_s"],
    }


def summarize(rounds: list[dict[str, dict[str, Any]]], variants: Sequence[str]) -> dict[str, Any]:
    """Each variant's best round (least CPU per request) and its mean over the rounds, the ratios of the bests and of
    the means, and each ratio round by round; in process, also the means of the export's and the collector's share."""
    cpu = {v: [r[v]["cpu_us"] for r in rounds] for v in variants}
    best = {v: min(values) for v, values in cpu.items()}
    mean = {v: statistics.fmean(values) for v, values in cpu.items()}
    pairs = [(a, b) for a, b in RATIOS if a in variants and b in variants]
    figures: dict[str, Any] = {
        "best_cpu_us": best,
        "mean_cpu_us": mean,
        "ratios": {f"{a}/{b}": best[a] / best[b] for a, b in pairs},
        "mean_ratios": {f"{a}/{b}": mean[a] / mean[b] for a, b in pairs},
        "round_ratios": {f"{a}/{b}": [r[a]["cpu_us"] / r[b]["cpu_us"] for r in rounds] for a, b in pairs},
    }
    if "gc_us" in rounds[0][variants[0]]:
        figures["mean_export_us"] = {v: statistics.fmean(r[v]["export_us"] for r in rounds) for v in variants}
        figures["mean_gc_us"] = {v: statistics.fmean(r[v]["gc_us"] for r in rounds) for v in variants}
        figures["full_collections"] = {v: sum(r[v]["gc_collections"][2] for r in rounds) for v in variants}
    return figures


def run(sizes: Sizes, protocol: str, baseline: Path | None, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    variants = ["off", "on", "sampled_out"] + (["baseline"] if baseline is not None else [])
    path = baseline_path(baseline, work) if baseline is not None else None
    near_free = build_near_free(work / NEAR_FREE)
    specs = {name: write_spec(work, name, REQUESTS[name][1], [REQUESTS[name][2] or {}]) for name in HTTP_REQUESTS}
    answered: Counter[str] = Counter()  # by the span each has: the requests the "on" variant answered
    http: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in HTTP_REQUESTS}
    inproc: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name, _ in sizes.inproc_requests}
    with Sink(protocol).serving() as sink:
        envs = {variant: variant_env(variant, sink, path) for variant in variants}
        servers = {v: spawn_server(v, envs[v], near_free, work) for v in variants}
        workers = {v: Worker.spawn(v, envs[v], near_free, work / f"worker-{v}.log") for v in variants}
        try:
            with running(*servers.values()):
                packages = {v: origin(v, worker.wait_ready(), baseline) for v, worker in workers.items()}
                for index in range(sizes.rounds):
                    order = variants if index % 2 == 0 else variants[::-1]
                    for name in HTTP_REQUESTS:
                        log(f"[tracing] round {index + 1}/{sizes.rounds}: {name} over HTTP")
                        http[name].append({v: window(servers[v], specs[name], sizes) for v in order})
                        answered[span_name(name)] += http[name][-1]["on"]["sent"]
                    for name, requests in sizes.inproc_requests:
                        log(f"[tracing] round {index + 1}/{sizes.rounds}: {name} in process")
                        inproc[name].append({v: workers[v].run(name, sizes.inproc_warmup, requests) for v in order})
                        answered[span_name(name)] += sizes.inproc_warmup + requests
                for server in servers.values():
                    server.process.terminate()  # they drain side by side; running() waits for each
        finally:
            for worker in workers.values():
                worker.close()  # they leave their lifespans side by side
            for worker in workers.values():
                worker.stop()  # after the servers stopped (and flushed theirs): the sink's count is complete
        exported = {"exports": sink.exports, "spans": dict(sink.spans)}
    return {
        "sizes": asdict(sizes),
        "protocol": protocol,
        "variants": variants,
        "packages": packages,
        "http": {name: {"rounds": rounds, **summarize(rounds, variants)} for name, rounds in http.items()},
        "inproc": {name: {"rounds": rounds, **summarize(rounds, variants)} for name, rounds in inproc.items()},
        "answered_by_on": dict(answered),
        "sink": exported,
    }


def origin(variant: str, package: str, baseline: Path | None) -> str:
    """Where a variant's worker imported ``scorekit`` from, ``checkout`` or ``baseline``, once it is the tree the
    variant stands for (else the comparison would measure one tree twice: an error)."""
    trees = {"checkout": ROOT / "scorekit"}
    if baseline is not None:
        trees["baseline"] = baseline / "scorekit"
    found = next((name for name, tree in trees.items() if Path(package) == tree.resolve()), package)
    if found != ("baseline" if variant == "baseline" else "checkout"):
        raise RuntimeError(f"the {variant} worker imported scorekit from {package}")
    return found


def span_name(request: str) -> str:
    """The name of the span a request gets: its method and route."""
    method, path, _ = REQUESTS[request]
    return f"{method} {path}"


def build_near_free(folder: Path) -> Path:
    """bench.model_host's near-free cross-encoder (torch and transformers load here, while nothing is measured)."""
    from bench.model_host import build_model

    return build_model(folder, "near-free")


def table(result: dict[str, Any]) -> str:
    variants = result["variants"]
    head = "".join(f"{v:>12}" for v in variants)
    lines = [f"{'CPU us / request, best round':<32}{head}   ratio of the best rounds (each round's), of the means"]
    for form, label in (("http", "over HTTP"), ("inproc", "in process")):
        for request, figures in result[form].items():
            best, rounds, means = figures["best_cpu_us"], figures["round_ratios"], figures["mean_ratios"]
            ratios = "  ".join(
                f"{pair} {value:.3f} ({min(rounds[pair]):.3f}-{max(rounds[pair]):.3f}), {means[pair]:.3f}"
                for pair, value in figures["ratios"].items()
            )
            lines.append(
                f"{request + ' ' + label:<32}" + "".join(f"{best[v]:>12.1f}" for v in variants) + f"   {ratios}"
            )
    lines.append(f"\n{'in process, means of the rounds':<32}{head}")
    for request, figures in result["inproc"].items():
        for key, text in (("mean_cpu_us", "CPU us"), ("mean_export_us", "of it exporting"), ("mean_gc_us", "of it GC")):
            values = "".join(f"{figures[key][v]:>12.1f}" for v in variants)
            lines.append(f"{request + ': ' + text:<32}{values}")
        values = "".join(f"{figures['full_collections'][v]:>12}" for v in variants)
        lines.append(f"{request + ': full collections':<32}{values}")
    sink = result["sink"]
    lines.append(f"\nsink ({result['protocol']}): {sink['exports']} exports, spans by name {sink['spans']}")
    lines.append(f"requests the on variant answered, by their span's name: {result['answered_by_on']}")
    return "\n".join(lines)


def worker_main(near_free: str) -> int:
    import scorekit

    # Where its package came from: the baseline's tree, or this checkout.
    package = os.path.realpath(os.path.dirname(scorekit.__file__))
    asyncio.run(_worker_passes(sys.stdin, sys.stdout, near_free, package))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="toy sizes: one short round")
    parser.add_argument("--out", type=Path, help="results folder (default: bench/results; smoke: a temp dir)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default: 3; smoke: 1)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default=PROTOCOLS[0], help="OTLP's, to the sink")
    parser.add_argument("--baseline", type=Path, help="a tree of the code before tracing, measured beside off")
    parser.add_argument("--keep-work", action="store_true", help="keep the folder of server and worker logs")
    parser.add_argument("--worker", metavar="NEAR_FREE", help=argparse.SUPPRESS)  # a variant's in-process worker
    args = parser.parse_args(argv)
    # Before torch loads anywhere, as the harness does for every server (docs/benchmarks.md, "How it measures").
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if args.worker:
        return worker_main(args.worker)
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        del os.environ[name]  # each variant's processes get only their own (variant_env)
    sizes = SMOKE if args.smoke else FULL
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    return run_tool(
        "tracing",
        lambda work, log: run(sizes, args.protocol, args.baseline, work, log),
        smoke=args.smoke,
        out=args.out,
        filename="tracing.json",
        table=table,
        keep_work=args.keep_work,
        kept="server and worker logs",
    )


if __name__ == "__main__":
    sys.exit(main())
