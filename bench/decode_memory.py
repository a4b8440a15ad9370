"""``python -m bench.decode_memory [--bodies 40] [--mb 15] [--rounds 3]``: a server's peak memory while large
bodies arrive at once.

It starts ``scorekit serve`` (the embedded model) on a free loopback port, with its log in a temporary folder,
and sends ``--rounds`` rounds of ``--bodies`` concurrent ``POST /rerank`` to 127.0.0.1, each body ``--mb`` MB: a
list of empty documents, the most objects JSON can make of a byte (a 15 MB body is a 40 MB list once decoded).
Each is refused for its count (400) once decoded, so the model runs nothing and what is measured is the bodies:
read, joined, decoded. It prints the server's resident set before the first round and its peak during the rounds
(VmHWM, reset before the first round where the kernel lets it), in MB.
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.servers import HOST, Server, running, spawn_scorekit

MB = 1000 * 1000


def body_of(megabytes: float) -> bytes:
    count = int(megabytes * MB) // 3  # '"",' per document
    return b'{"query": "q", "documents": [' + b",".join([b'""'] * count) + b"]}"


def post(port: int, body: bytes) -> int:
    connection = http.client.HTTPConnection(HOST, port, timeout=300)
    try:
        connection.request("POST", "/rerank", body, {"content-type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def reset_peak(server: Server) -> bool:
    """Start VmHWM again from the current resident set (``clear_refs`` 5), where the kernel allows it."""
    try:
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measure(bodies: int, megabytes: float, rounds: int) -> dict[str, float]:
    body = body_of(megabytes)
    with tempfile.TemporaryDirectory(prefix="decode-memory-") as logs:
        server = spawn_scorekit("scorekit", Path(logs))
        with running(server):
            assert post(server.port, b'{"query": "q", "documents": ["d"]}') == 200  # warm
            before = server.status_kib("VmRSS")
            reset = reset_peak(server)
            sampled = [before]
            done = threading.Event()

            def sample() -> None:  # where VmHWM cannot be reset: the highest resident set seen every 10 ms
                while not done.wait(0.01):
                    sampled.append(server.status_kib("VmRSS"))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.perf_counter()
            with ThreadPoolExecutor(bodies) as pool:
                for _ in range(rounds):
                    statuses = list(pool.map(lambda _: post(server.port, body), range(bodies)))
                    assert statuses == [400] * bodies, statuses
            seconds = time.perf_counter() - started
            done.set()
            sampler.join()
            peak = server.status_kib("VmHWM") if reset else max(sampled)
    return {
        "bodies": bodies,
        "body_mb": len(body) / MB,
        "rounds": rounds,
        "rss_before_mb": before * 1024 / MB,
        "peak_mb": peak * 1024 / MB,
        "peak_over_before_mb": (peak - before) * 1024 / MB,
        "peak_from": "VmHWM" if reset else "VmRSS every 10 ms",
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=40)
    parser.add_argument("--mb", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(measure(args.bodies, args.mb, args.rounds), indent=2))


if __name__ == "__main__":
    main()
