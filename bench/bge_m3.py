"""``python -m bench.bge_m3 [--rounds N] [--window S]``: what bge-m3's three outputs together cost, against its dense
output alone (issue 31's target: at most 1.15x).

A bge-m3 of all-MiniLM-L6-v2's shape (an XLMRobertaModel of width 384, six layers, random weights; its ColBERT head
384 to 384, as bge-m3's is its width to its width), built by ``tests.tiny_models.build_bge_m3`` with the benchmark
corpus's words in its tokenizer. Its heads weigh four times more against this encoder than bge-m3's against its own
(24 layers of width 1024), so the ratios here bound the real model's from above. The work is reranking: 1 query x 100
documents of about 90 tokens (three corpus documents each), scored by the dense score alone (``score_mode:
"dense"``: each input asks for its dense vector only) or by the default ``colbert+sparse+dense`` (each input asks for
all three, from the same forward, and a pair's score is the weighted sum of the dot, the lexical match and MaxSim).
Three measures, each in windows that alternate between the two, CPU seconds per request (per input for the first):

- forward: ``backend.forward`` of 32 documents' inputs, alone (the heads, and the outputs copied out);
- in process: the request's plan as the engine runs it (tokenizing, forwards of 32 inputs, the finish);
- served: of a ``scorekit serve`` process answering /rerank (HTTP and JSON too), one request at a time.

Both processes run torch's default threads with ``OMP_WAIT_POLICY=PASSIVE``. Figures are medians over the rounds,
printed as one JSON object; the exit status is 1 when a median ratio is over the target.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from bench.corpus import WORDS, documents, queries
from bench.cpu import tree_cpu_s
from bench.servers import HOST, running, spawn_scorekit
from scorekit.models import BGEM3Backend, load_backend
from scorekit.models.base import no_checkpoint
from scorekit.tasks import PairOptions, ScoreMode
from tests.tiny_models import build_bge_m3

DOCUMENTS = 100
BATCH = 32
TARGET = 1.15
MODES: tuple[ScoreMode, ScoreMode] = ("dense", "colbert+sparse+dense")


def requests(count: int) -> list[dict[str, Any]]:
    """``count`` distinct bodies: a query and 100 documents of three corpus documents each."""
    pool = documents(3 * DOCUMENTS * count)
    return [
        {
            "query": query,
            "documents": [
                " ".join(pool[3 * (DOCUMENTS * r + i) : 3 * (DOCUMENTS * r + i) + 3]) for i in range(DOCUMENTS)
            ],
        }
        for r, query in enumerate(queries(count))
    ]


def per_second(work: Callable[[int], int], window: float) -> float:
    """CPU seconds of this process per unit of ``work(i)`` (which returns its units), run for ``window`` seconds."""
    done = units = 0
    cpu, started = time.process_time(), time.perf_counter()
    while time.perf_counter() - started < window or done == 0:
        units += work(done)
        done += 1
    return (time.process_time() - cpu) / units


def forward_cost(backend: BGEM3Backend, bodies: list[dict[str, Any]], mode: ScoreMode, window: float) -> float:
    """CPU seconds per input of forwards of ``BATCH`` documents' inputs asking what ``mode`` needs."""
    batches = []
    for body in bodies:
        plan = backend.plan_pairs([body["query"]], body["documents"], PairOptions(score_mode=mode))
        inputs = plan.encode(no_checkpoint).inputs[1:]
        batches += [inputs[start : start + BATCH] for start in range(0, len(inputs), BATCH)]
    return per_second(lambda i: len(backend.forward(batches[i % len(batches)])), window)


def plan_cost(backend: BGEM3Backend, bodies: list[dict[str, Any]], mode: ScoreMode, window: float) -> float:
    """CPU seconds per request of its plan as the engine runs it: encode, forwards of ``BATCH`` inputs, finish."""

    def one(i: int) -> int:
        body = bodies[i % len(bodies)]
        encoding = backend.plan_pairs([body["query"]], body["documents"], PairOptions(score_mode=mode)).encode(
            no_checkpoint
        )
        inputs = encoding.inputs
        outputs = [
            output
            for start in range(0, len(inputs), BATCH)
            for output in backend.forward(inputs[start : start + BATCH])
        ]
        encoding.finish(outputs)
        return 1

    return per_second(one, window)


def served_cost(port: int, pid: int, bodies: list[dict[str, Any]], mode: ScoreMode, window: float) -> float:
    """CPU seconds of the server per /rerank request in ``mode``, one request at a time for ``window`` seconds."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    sent = 0
    cpu, started = tree_cpu_s(pid), time.perf_counter()
    while time.perf_counter() - started < window or sent == 0:
        body = json.dumps({**bodies[sent % len(bodies)], "return_documents": False, "score_mode": mode})
        connection.request("POST", "/rerank", body, {"content-type": "application/json"})
        answer = connection.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"/rerank answered {answer.status}: {answer.read()[:300]!r}")
        answer.read()
        sent += 1
    seconds = tree_cpu_s(pid) - cpu
    connection.close()
    return seconds / sent


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bge_m3", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=5.0, help="seconds of each window")
    args = parser.parse_args()
    bodies = requests(4)
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as work:
        folder = build_bge_m3(
            Path(work) / "bge-m3", hidden=384, layers=6, heads=12, text=" ".join(WORDS), init_range=0.02
        )
        backend = load_backend(str(folder))
        assert isinstance(backend, BGEM3Backend)
        server = spawn_scorekit("bge-m3", Path(work), [str(folder)])
        with running(server):
            for mode in MODES:  # the one-off costs of the first requests
                served_cost(server.port, server.pid, bodies[:1], mode, 0)
                plan_cost(backend, bodies[:1], mode, 0)
            for _ in range(args.rounds):
                row: dict[str, float] = {}
                for mode in MODES:
                    row[f"forward {mode}"] = forward_cost(backend, bodies, mode, args.window)
                    row[f"in process {mode}"] = plan_cost(backend, bodies, mode, args.window)
                    row[f"served {mode}"] = served_cost(server.port, server.pid, bodies, mode, args.window)
                for measure in ("forward", "in process", "served"):
                    row[f"{measure} ratio"] = row[f"{measure} {MODES[1]}"] / row[f"{measure} {MODES[0]}"]
                rows.append(row)
    median = {key: round(statistics.median(row[key] for row in rows), 4) for key in rows[0]}
    result = {
        "documents_per_request": DOCUMENTS,
        "torch_threads": torch.get_num_threads(),
        "cpu_seconds": "per input (forward), per request (in process, served)",
        "rounds": [{key: round(value, 4) for key, value in row.items()} for row in rows],
        "median": median,
        "target": TARGET,
    }
    print(json.dumps(result, indent=2))
    sys.exit(0 if all(median[f"{measure} ratio"] <= TARGET for measure in ("forward", "in process", "served")) else 1)


if __name__ == "__main__":
    main()
