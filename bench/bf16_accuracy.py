"""``python -m bench.bf16_accuracy``: how far ``--dtype bfloat16`` moves each model kind's scores from float32 on
the CPU, and how often it changes a rerank's top 10. An accuracy measurement, not a benchmark: nothing is timed
but the one CPU-time ratio at the end.

The query set: 50 questions written for this script about Python's semantics, each scored against the same 100
documents, the first 100 prose paragraphs (over 40 words, no grammar rules) of the Python reference manual's
help topics that ship with the interpreter (``pydoc_data.topics``: real text, offline, but it changes with the
Python version). Every kind scores all 5,000 pairs in float32 and in bfloat16, through ``load_backend`` and the
backend's own plan, as the server runs them (batches of 32 model inputs).

Only the bi-encoder is a trained model (the embedded all-MiniLM-L6-v2). The others are the tests' tiny random
models, so their figures are an upper-bound sanity check of the arithmetic, not a statement about any trained
model's quality.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics
from typing import TypeVar

import torch
from transformers.utils import logging as hf_logging

from scorekit.models import (
    Backend,
    LabelScorer,
    ModelKind,
    PairScorer,
    Plan,
    default_model_path,
    detect_kind,
    load_backend,
)
from scorekit.models.base import Encoded, no_checkpoint
from scorekit.models.bf16 import native_bf16
from scorekit.tasks import LabelQuery, PairOptions
from tests.tiny_models import build_causal_lm, build_cross_encoder, build_gemma_reranker, build_qwen3_reranker

QUERIES = (
    "what does the with statement call when the block exits",
    "how is an exception re-raised after a finally clause",
    "how are keyword arguments matched to a function's parameters",
    "what happens when a generator function calls yield",
    "when is a name in a function local and when is it global",
    "how does Python compare two objects of different types",
    "what is the difference between is and ==",
    "how are default argument values evaluated",
    "how does slicing work on a sequence with a step",
    "what does the nonlocal statement do",
    "how are augmented assignments like += performed",
    "how does an import statement find and load a module",
    "what happens when an object is deleted with del",
    "how does the for loop use an iterator",
    "what does the else clause of a loop mean",
    "how are floating point literals written",
    "what is the result of dividing two integers",
    "how do format strings replace fields with values",
    "which values count as false in a boolean context",
    "how does the lambda expression create a function",
    "how does a class body define methods and attributes",
    "what does __getattr__ do when an attribute is missing",
    "how are dictionaries created and what can their keys be",
    "how does the raise statement attach a cause to an exception",
    "what does the assert statement do when optimizations are on",
    "how are string literals concatenated",
    "what do the bitwise operators do on integers",
    "how does the power operator bind compared with unary minus",
    "what is the order in which operators are evaluated",
    "how does an async function differ from a normal function",
    "what does await do inside a coroutine",
    "how does the try statement choose an except clause",
    "what happens when break is used inside a try with finally",
    "how do conditional expressions evaluate their operands",
    "how are list displays and comprehensions evaluated",
    "what special methods make an object callable",
    "how does Python decide the truth value of an object",
    "what is the difference between mutable and immutable sequences",
    "what methods do string objects offer for searching",
    "how do comparisons chain like a < b < c",
    "what does the global statement declare",
    "how are integer literals written in hex, octal and binary",
    "what attributes does a module object have",
    "how does the pdb debugger set a breakpoint",
    "what is a code object and how is it executed",
    "how does a context manager suppress an exception",
    "what does the return statement do inside a generator",
    "how do shifting operations work on negative numbers",
    "what are the built-in numeric types",
    "how does the in operator test membership",
)
DOCUMENTS = 100
BATCH = 32  # model inputs per forward, as the server batches them
TOP = 10
R = TypeVar("R")


def documents(count: int = DOCUMENTS) -> list[str]:
    """The first ``count`` prose paragraphs of the reference manual's help topics (grammar rules and short
    headings left out), in topic order, with their line breaks joined."""
    paragraphs = (paragraph for name in sorted(topics) for paragraph in topics[name].split("\n\n"))
    prose = (" ".join(p.split()) for p in paragraphs if len(p.split()) > 40 and "::=" not in p)
    return [paragraph for paragraph, _ in zip(prose, range(count), strict=False)]


@dataclass(frozen=True, slots=True)
class Kind:
    """A model kind: its folder, the kind to load it as, and how it scores every (query, document) pair."""

    name: str
    folder: str
    kind: ModelKind
    score: Callable[[Backend, Sequence[str], Sequence[str]], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Agreement:
    """bfloat16 against float32 over one query set."""

    max_abs_diff: float
    mean_abs_diff: float
    top_set_changed: float  # share of queries whose top 10 holds other documents
    top_order_changed: float  # share of queries whose top 10, in order, differs


def run_plan(backend: Backend, plan: Plan[R]) -> R:
    """A plan run as the engine runs it: encode, forward in batches, finish."""
    encoding = plan.encode(no_checkpoint)
    inputs: list[Encoded] = encoding.inputs
    outputs = [out for start in range(0, len(inputs), BATCH) for out in backend.forward(inputs[start : start + BATCH])]
    return encoding.finish(outputs)


def pair_scores(backend: Backend, queries: Sequence[str], docs: Sequence[str]) -> torch.Tensor:
    """/score's scores of every pair (one N:N request, so each distinct text or pair runs once), as a
    queries x documents matrix; inputs over the model's length are cut to it (``truncate_prompt_tokens`` -1)."""
    assert isinstance(backend, PairScorer)
    side1 = [query for query in queries for _ in docs]
    side2 = [doc for _ in queries for doc in docs]
    plan = backend.plan_pairs(side1, side2, PairOptions(truncate=-1))
    return torch.tensor(run_plan(backend, plan).scores).view(len(queries), len(docs))


# The tiny causal LM's MiniLM vocabulary: "yes" and "no", as a yes/no judge would be asked.
YES_NO = [2748, 2053]


def label_scores(backend: Backend, queries: Sequence[str], docs: Sequence[str]) -> torch.Tensor:
    """/generative_scoring's score (P("yes") over "yes" and "no") of each document after each query."""
    assert isinstance(backend, LabelScorer)
    rows = []
    for query in queries:
        plan = backend.plan_labels(LabelQuery(query=query, items=list(docs), label_token_ids=YES_NO))
        rows.append([probabilities[0] for probabilities in run_plan(backend, plan).probabilities])
    return torch.tensor(rows)


def compare(exact: torch.Tensor, approximate: torch.Tensor, top: int = TOP) -> Agreement:
    """How far the scores moved, and how often each query's top ``top`` (a stable sort, as /rerank's) changed."""
    exact_top = [_ranking(row)[:top] for row in exact]
    approximate_top = [_ranking(row)[:top] for row in approximate]
    pairs = list(zip(exact_top, approximate_top, strict=True))
    difference = (exact.double() - approximate.double()).abs()
    return Agreement(
        max_abs_diff=float(difference.max()),
        mean_abs_diff=float(difference.mean()),
        top_set_changed=sum(set(a) != set(b) for a, b in pairs) / len(pairs),
        top_order_changed=sum(a != b for a, b in pairs) / len(pairs),
    )


def _ranking(scores: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.sort(scores, descending=True, stable=True).indices]


def kinds(work: Path, docs: Sequence[str]) -> list[Kind]:
    """The embedded MiniLM and the tests' tiny random models. The Qwen3 one's BPE tokenizer learns the documents'
    words, so they take about as many tokens as with a real vocabulary; the Gemma one's does not, and most of its
    prompts are cut to its 256 positions (``truncate_prompt_tokens`` -1 cuts the document)."""
    return [
        Kind("bi-encoder (all-MiniLM-L6-v2)", default_model_path(), "bi-encoder", pair_scores),
        Kind("cross-encoder (tiny BERT)", str(build_cross_encoder(work / "ce")), "cross-encoder", pair_scores),
        Kind("causal-lm (tiny Llama)", str(build_causal_lm(work / "lm")), "causal-lm", label_scores),
        Kind(
            "llm-reranker (tiny Qwen3)",
            str(build_qwen3_reranker(work / "qwen3", corpus=[*docs, *QUERIES])),
            "llm-reranker",
            pair_scores,
        ),
        Kind("llm-reranker (tiny Gemma)", str(build_gemma_reranker(work / "gemma")), "llm-reranker", pair_scores),
    ]


def _yours(folder: str) -> Kind:
    """A model of your own, as ``scorekit serve`` detects it; a causal LM is measured as an LLM reranker."""
    kind = detect_kind(folder)
    return Kind(Path(folder).name, folder, "llm-reranker" if kind == "causal-lm" else kind, pair_scores)


def measure(
    kind: Kind, queries: Sequence[str], docs: Sequence[str], device: str, dtypes: Sequence[str]
) -> dict[str, Agreement]:
    """One kind's scores in each of ``dtypes`` on ``device`` against float32 on the CPU (scored once), each loaded
    the way ``scorekit serve --device --dtype`` loads it."""
    exact = kind.score(load_backend(kind.folder, kind=kind.kind), queries, docs)
    return {
        dtype: compare(
            exact, kind.score(load_backend(kind.folder, kind=kind.kind, device=device, dtype=dtype), queries, docs)
        )
        for dtype in dtypes
    }


def cpu_time_ratio(docs: Sequence[str], repeats: int = 3) -> float:
    """MiniLM's forward of one batch of documents in bfloat16 over float32, in CPU seconds of this process
    (the median of ``repeats``; CPU time, not wall time, so other work on a shared machine counts less)."""
    seconds = []
    for dtype in ("float32", "bfloat16"):
        backend = load_backend(default_model_path(), dtype=dtype)
        batch = backend.encode_texts(list(docs[:BATCH]), -1, None)  # type: ignore[attr-defined]
        backend.forward(batch)  # warm up the kernels
        runs = []
        for _ in range(repeats):
            started = time.process_time()
            backend.forward(batch)
            runs.append(time.process_time() - started)
        seconds.append(statistics.median(runs))
    return seconds[1] / seconds[0]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--queries", type=int, default=len(QUERIES), help="how many of the 50 queries")
    parser.add_argument("--documents", type=int, default=DOCUMENTS, help="documents per query (at most ~500)")
    parser.add_argument("--model", help="measure this model folder instead (one that /rerank serves)")
    parser.add_argument("--device", default="cpu", help="where the measured dtypes run (cuda: a GPU's kernels)")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated dtypes measured against CPU float32")
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # the tiny models' "Writing model shards" bars
    queries, docs = QUERIES[: args.queries], documents(args.documents)
    print(f"{len(queries)} queries x {len(docs)} documents; native bf16: {', '.join(native_bf16()) or 'none'}")
    print(f"against float32 on the CPU: {args.dtypes} on {args.device}")
    header = f"{'kind':30} {'dtype':>8} {'max |diff|':>10} {'mean':>8} {'top-10 set changed':>18} {'order changed':>13}"
    print(header)
    with tempfile.TemporaryDirectory() as work:
        for kind in [_yours(args.model)] if args.model else kinds(Path(work), docs):
            for dtype, found in measure(kind, queries, docs, args.device, args.dtypes.split(",")).items():
                print(
                    f"{kind.name:30} {dtype:>8} {found.max_abs_diff:10.5f} {found.mean_abs_diff:8.5f} "
                    f"{found.top_set_changed:18.0%} {found.top_order_changed:13.0%}"
                )
    if args.device == "cpu":
        print(f"MiniLM forward, {BATCH} documents: bf16 takes {cpu_time_ratio(docs):.1f}x the CPU time of float32")


if __name__ == "__main__":
    main()
