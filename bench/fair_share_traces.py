"""Where a quiet key's slow requests spend their time beside another key's flood, read from their traces.

``python -m bench.fair_share_traces [--alone 150] [--seconds 20] [--concurrency 32]`` starts ``scorekit serve`` with
two API keys and traces exported over OTLP/HTTP to a receiver in this process (``tests/otlp.py``), sampled by the
parent only (``OTEL_TRACES_SAMPLER=parentbased_always_off``): the probes send a sampled ``traceparent``, the flood
sends none, so only the probes are traced and the flood pays nothing for it. The quiet key's 1-document reranks (the
fairness scenario's probe) go one at a time on one connection, ``--alone`` of them alone, then for ``--seconds``
beside the other key's flood of 16-document reranks from a client process of its own (``bench.loadgen flood``).

It prints each phase's client-side latencies, then each part of a probe's time as its spans say (decode, tokenize,
queue, batch, encode, and the server's whole span), and what the client saw outside the server's span (the request
waiting to be read, the answer to be written: the event loop's and the kernel's share), then the slowest 1% one by
one. The figures are the fairness scenario's ``two_keys`` case, taken apart (docs/benchmarks.md, "Two keys, one
flooding").
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.corpus import documents, queries, rerank_body, rerank_set
from bench.driver import write_spec
from bench.servers import ROOT
from tests.live import free_port
from tests.otlp import OtlpReceiver, otlp_receiver

QUIET, FLOOD = "bench-quiet-key", "bench-flood-key"
PARTS = ("decode", "tokenize", "queue", "batch", "encode")
Probe = tuple[str, float]  # (trace id, client milliseconds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fair_share_traces")
    parser.add_argument("--alone", type=int, default=150, help="probes alone, before the flood")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of probes beside the flood")
    parser.add_argument("--concurrency", type=int, default=32, help="the flood's connections")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-traces-"))
    flood_spec = write_spec(work, "rerank", "/rerank", rerank_set(64, 16).bodies)
    body = json.dumps(rerank_body(queries(1, seed=21)[0], documents(1, seed=21))).encode()
    (work / "keys").write_text(f"{QUIET} name=quiet\n{FLOOD} name=flood\n")
    with otlp_receiver("http/protobuf") as receiver:
        port = free_port()
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OTEL_TRACES_SAMPLER="parentbased_always_off")
        env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        serve = [sys.executable, "-m", "scorekit.cli", "serve", "--port", str(port), "--log-level", "warning"]
        serve += ["--api-key-file", str(work / "keys"), "--otlp-traces-endpoint", receiver.endpoint]
        serve += ["--otlp-traces-protocol", "http/protobuf"]
        server = subprocess.Popen(serve, env=env, cwd=ROOT)
        try:
            connection = _ready(port)
            for _ in range(5):
                _probe(connection, body)
            alone = [_probe(connection, body) for _ in range(args.alone)]
            flood = [sys.executable, "-m", "bench.loadgen", "flood", "--port", str(port), "--spec", str(flood_spec)]
            flood += ["--key", FLOOD, "--concurrency", str(args.concurrency)]
            flooding = subprocess.Popen(flood, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
            time.sleep(1.5)
            loaded: list[Probe] = []
            until = time.perf_counter() + args.seconds
            while time.perf_counter() < until:
                loaded.append(_probe(connection, body))
            out, _ = flooding.communicate(b"", timeout=120)
            print(f"the flood: {json.loads(out)['answered']} reranks answered")
            ids = {trace for trace, _ in alone + loaded}
            receiver.wait_for(lambda spans: ids <= {s.trace_id for s in spans if s.name == "POST /rerank"}, 60)
        finally:
            server.terminate()
            server.wait(30)
        for name, probes in (("alone", alone), ("beside the flood", loaded)):
            _report(receiver, name, probes)
    return 0


def _ready(port: int) -> http.client.HTTPConnection:
    for _ in range(900):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("GET", "/readyz")
            answer = connection.getresponse()
            answer.read()
            if answer.status == 200:
                return connection
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server never became ready")


def _probe(connection: http.client.HTTPConnection, body: bytes) -> Probe:
    trace = secrets.token_hex(16)
    headers = {"content-type": "application/json", "authorization": f"Bearer {QUIET}"}
    headers["traceparent"] = f"00-{trace}-{secrets.token_hex(8)}-01"
    started = time.perf_counter()
    connection.request("POST", "/rerank", body, headers)
    answer = connection.getresponse()
    answer.read()
    if answer.status != 200:
        raise RuntimeError(f"a probe was answered {answer.status}")
    return trace, (time.perf_counter() - started) * 1000


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _report(receiver: OtlpReceiver, name: str, probes: list[Probe]) -> None:
    client = [ms for _, ms in probes]
    print(
        f"\n{name}: {len(client)} probes, client ms p50 {_quantile(client, 0.5):.1f} p90 {_quantile(client, 0.9):.1f}"
        f" p99 {_quantile(client, 0.99):.1f} max {max(client):.1f}"
    )
    rows = []
    for trace, ms in probes:
        (span,) = [s for s in receiver.trace(trace) if s.name == "POST /rerank"]
        parts = dict.fromkeys(PARTS, 0.0)
        for child in receiver.children_of(span):
            parts[child.name] = parts.get(child.name, 0.0) + child.duration_ns / 1e6
        rows.append((ms, span.duration_ns / 1e6, parts))
    print("  ms                  p50     p99     max")
    for part in PARTS:
        values = [parts[part] for _, _, parts in rows]
        print(f"  {part:16s} {_quantile(values, 0.5):7.2f} {_quantile(values, 0.99):7.2f} {max(values):7.2f}")
    for label, values in (("server span", [r[1] for r in rows]), ("outside it", [r[0] - r[1] for r in rows])):
        print(f"  {label:16s} {_quantile(values, 0.5):7.2f} {_quantile(values, 0.99):7.2f} {max(values):7.2f}")
    for ms, server, parts in sorted(rows, key=lambda row: -row[0])[: max(3, len(rows) // 100)]:
        said = " ".join(f"{part} {parts[part]:.1f}" for part in PARTS)
        print(f"  slow: client {ms:.1f}, server span {server:.1f}: {said}")


if __name__ == "__main__":
    sys.exit(main())
