"""Texts shared by the end-to-end tests."""

from __future__ import annotations

QUERY = "What is the capital of France?"
DOCS = [
    "The capital of Brazil is Brasilia.",
    "The capital of France is Paris.",
    "Cross-encoder models are neat, and this sentence is a good deal longer than the others.",
]


def many_docs(n: int) -> list[str]:
    """n distinct documents of about a dozen tokens each, for requests that span many batches."""
    return [f"document number {i} talks about topic {i % 17} in some detail" for i in range(n)]
