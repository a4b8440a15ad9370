"""Deterministic texts: documents of about 30 tokens and short queries, the same on every run.

Words come from a fixed list of common English words that MiniLM's WordPiece vocabulary holds as
single tokens, so a document of 28 words is 30 tokens with [CLS] and [SEP].
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

WORDS = (
    "search",
    "ranking",
    "model",
    "query",
    "document",
    "score",
    "server",
    "batch",
    "token",
    "request",
    "answer",
    "result",
    "system",
    "network",
    "memory",
    "thread",
    "worker",
    "latency",
    "budget",
    "cache",
    "index",
    "vector",
    "cloud",
    "data",
    "table",
    "field",
    "value",
    "public",
    "private",
    "simple",
    "common",
    "small",
    "large",
    "early",
    "late",
    "first",
    "last",
    "best",
    "fast",
    "slow",
    "open",
    "close",
    "river",
    "mountain",
    "city",
    "garden",
    "market",
    "school",
    "music",
    "letter",
    "window",
    "summer",
    "winter",
    "morning",
    "evening",
    "paper",
    "story",
    "history",
    "science",
    "energy",
    "water",
    "light",
    "power",
    "engine",
    "travel",
    "house",
    "family",
    "friend",
    "language",
    "computer",
    "program",
    "number",
    "design",
    "study",
    "report",
    "market",
    "price",
    "money",
    "health",
    "doctor",
)

DOC_WORDS = 28
QUERY_WORDS = 6


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def documents(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct documents (a numeric tag keeps them distinct, since each text is embedded once)."""
    rng = random.Random(seed)
    return [f"{_sentence(rng, DOC_WORDS - 1)} {i}" for i in range(n)]


def queries(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"{_sentence(rng, QUERY_WORDS - 1)} q{i}" for i in range(n)]


@dataclass(frozen=True, slots=True)
class RequestSet:
    """Rerank bodies and the texts each one sends to the model (query first), in the same order."""

    bodies: list[dict[str, object]]
    texts: list[list[str]]

    @property
    def items_per_request(self) -> float:
        return sum(map(len, self.texts)) / len(self.texts)


def rerank_set(requests: int, docs_per_request: int, seed: int = 0) -> RequestSet:
    """``requests`` distinct rerank bodies, each with its own query and distinct documents."""
    pool = documents(max(4 * docs_per_request, 512), seed)
    rng = random.Random(seed + 7)
    bodies: list[dict[str, object]] = []
    texts: list[list[str]] = []
    for query in queries(requests, seed + 1):
        docs = rng.sample(pool, docs_per_request)
        bodies.append(rerank_body(query, docs))
        texts.append([query, *docs])
    return RequestSet(bodies, texts)


def rerank_body(query: str, docs: list[str]) -> dict[str, object]:
    """Documents are not echoed back: the client's JSON work should not be what we measure."""
    return {"query": query, "documents": docs, "return_documents": False}


def trivial_body() -> dict[str, object]:
    """The framework-overhead request: a query and four short documents."""
    return {"query": "fast search ranking", "documents": ["search model", "ranking", "fast", "slow light"]}


def dump(path: str, bodies: list[dict[str, object]]) -> str:
    """The JSON the load generator reads: the path and the bodies to send round-robin."""
    return json.dumps({"path": path, "bodies": bodies})
