"""``python -m bench.late_interaction [--rounds N] [--window S]``: MaxSim reranking served, against its ceiling.

A ColBERT of answerai-colbert-small's shape: all-MiniLM-L6-v2's encoder (width 384, six layers; the embedded
model's weights) with PyLate's [Q] and [D] markers added and a random projection to 128 dimensions, saved in
PyLate's layout (query_length 32, document_length 180), served by ``scorekit serve`` in a process of its own. One
client sends /rerank requests of 1 query x 100 documents (about 90 words each, under the 180-token limit), one at a
time; the windows alternate with the ceiling, and each reports documents scored per CPU second:

- served: of the server process (HTTP, JSON, tokenizing, the queue, the forward, MaxSim, the answer);
- ceiling: of this process, running the same requests' inputs, tokenized beforehand, as the server runs them: the
  request's inputs sorted by length, in forwards of the mean batch size the server's /metrics report for its window
  (its batcher cuts a request's 101 inputs into batches its CPU runs best), then the plan's finish (MaxSim of the
  query's vectors against every document's, batched);
- the ratio served / ceiling, whose target is 0.9 (issue 31).

Both processes run torch's default threads with ``OMP_WAIT_POLICY=PASSIVE`` (the CLI's default: no spinning at
barriers, which would count as CPU). Figures are medians over the rounds, printed as one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Before torch loads, as the server's CLI does: OpenMP threads spinning at barriers would count as the ceiling's CPU.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, BertModel

from bench.corpus import documents, queries
from bench.cpu import tree_cpu_s
from bench.promtext import Snapshot
from bench.servers import HOST, running, spawn_scorekit
from scorekit.models import default_model_path, load_backend
from scorekit.models.base import no_checkpoint
from scorekit.tasks import PairOptions

DOCUMENTS = 100
TARGET = 0.9


def build(folder: Path) -> Path:
    """The PyLate folder described above."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokenizer.add_tokens(["[Q] ", "[D] "])
    encoder = BertModel.from_pretrained(default_model_path())
    encoder.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    (folder / "1_Dense").mkdir()
    save_file({"linear.weight": torch.randn(128, 384) * 0.05}, str(folder / "1_Dense" / "model.safetensors"))
    dense = {"in_features": 384, "out_features": 128, "bias": False, "activation_function": "torch.nn.Identity"}
    (folder / "1_Dense" / "config.json").write_text(json.dumps(dense))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    config = {
        "model_type": "ColBERT",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": 32,
        "document_length": 180,
        "do_query_expansion": True,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    return folder


def requests(count: int) -> list[dict[str, Any]]:
    """``count`` distinct bodies: a query and 100 documents of three corpus documents each (about 90 words)."""
    pool = documents(3 * DOCUMENTS * count)
    return [
        {
            "query": query,
            "documents": [
                " ".join(pool[3 * (DOCUMENTS * r + i) : 3 * (DOCUMENTS * r + i) + 3]) + "." for i in range(DOCUMENTS)
            ],
        }
        for r, query in enumerate(queries(count))
    ]


def served(port: int, pid: int, bodies: list[dict[str, Any]], window: float) -> tuple[float, float]:
    """Documents scored per CPU second of the server, sending ``bodies`` in turn for ``window`` seconds, and the
    mean size of the batches it ran them in."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    sent = 0
    before = _metrics(connection)
    cpu, started = tree_cpu_s(pid), time.perf_counter()
    while time.perf_counter() - started < window or sent == 0:
        body = json.dumps({**bodies[sent % len(bodies)], "return_documents": False})
        connection.request("POST", "/rerank", body, {"content-type": "application/json"})
        answer = connection.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"/rerank answered {answer.status}: {answer.read()[:300]!r}")
        answer.read()
        sent += 1
    seconds = tree_cpu_s(pid) - cpu
    batches = _metrics(connection).minus(before)
    connection.close()
    return sent * DOCUMENTS / seconds, batches["batch_items"] / max(batches["batches"], 1)


def _metrics(connection: http.client.HTTPConnection) -> Snapshot:
    connection.request("GET", "/metrics")
    return Snapshot.parse(connection.getresponse().read().decode(), time.perf_counter())


def ceiling(backend: Any, bodies: list[dict[str, Any]], window: float, batch: int) -> float:
    """Documents scored per CPU second of this process, running the bodies' inputs as the server runs them, in
    forwards of ``batch`` inputs."""
    encodings = [
        backend.plan_pairs([body["query"]], body["documents"], PairOptions()).encode(no_checkpoint) for body in bodies
    ]
    done = 0
    cpu, started = time.process_time(), time.perf_counter()
    while time.perf_counter() - started < window or done == 0:
        encoding = encodings[done % len(encodings)]
        order = sorted(range(len(encoding.inputs)), key=lambda i: encoding.inputs[i].cost)
        outputs = []
        for start in range(0, len(order), batch):
            outputs += backend.forward([encoding.inputs[i] for i in order[start : start + batch]])
        in_order: list[Any] = [None] * len(order)
        for place, output in zip(order, outputs, strict=True):
            in_order[place] = output
        encoding.finish(in_order)
        done += 1
    return done * DOCUMENTS / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.late_interaction", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0, help="seconds of each window")
    args = parser.parse_args()
    bodies = requests(8)
    with tempfile.TemporaryDirectory() as work:
        folder = build(Path(work) / "colbert")
        backend = load_backend(str(folder))
        server = spawn_scorekit("late-interaction", Path(work), [str(folder)])
        rows: list[dict[str, float]] = []
        with running(server):
            served(server.port, server.pid, bodies[:1], 0)  # the first request's one-off costs
            ceiling(backend, bodies[:1], 0, DOCUMENTS + 1)
            for _ in range(args.rounds):
                rate, batch = served(server.port, server.pid, bodies, args.window)
                ideal = ceiling(backend, bodies, args.window, max(round(batch), 1))
                rows.append({"served": rate, "ceiling": ideal, "ratio": rate / ideal, "mean_batch": batch})
    median = {key: round(statistics.median(row[key] for row in rows), 3) for key in ("served", "ceiling", "ratio")}
    result = {
        "documents_per_request": DOCUMENTS,
        "torch_threads": torch.get_num_threads(),
        "rounds": [{key: round(value, 3) for key, value in row.items()} for row in rows],
        "median": median,
        "target": TARGET,
    }
    print(json.dumps(result, indent=2))
    sys.exit(0 if median["ratio"] >= TARGET else 1)


if __name__ == "__main__":
    main()
