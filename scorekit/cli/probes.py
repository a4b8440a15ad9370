"""The probes ``scorekit check`` runs through the served path and through the reference recipe (:mod:`.reference`),
and the rows it compares.

The served path is what the engine runs for a request: the backend's plan (``plan_pairs``, ``plan_embed``,
``plan_labels``), its inputs encoded, one forward, the plan's finish. The probes are a few fixed pairs, short and
varied (a question, a sentence, another language, one letter each, a long-ish document), each its own request, and
one request of the first query with the other documents, as a reranking request sends them (an LLM reranker's
prompts then share their prefix, a listwise reranker reads the documents in one context). A probe the model is too
short for is skipped, and said so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from scorekit.errors import InputTooLong
from scorekit.models import Backend, Encoded, LabelScorer, PairScorer, Plan
from scorekit.models.base import Embedder, no_checkpoint
from scorekit.tasks import EmbedOptions, LabelQuery, PairOptions

from .reference import EmbeddingRecipe, LabelRecipe, PairRecipe

LONG = (
    "The printing press, developed in Mainz around 1440 by Johannes Gutenberg, combined movable metal type, an"
    " oil-based ink and a screw press adapted from those used to make wine. Within fifty years presses worked in"
    " more than two hundred European cities, books became cheaper and more common, and the spread of ideas during"
    " the Renaissance and the Reformation owed much to it."
)
PAIRS = (
    ("what is the capital of france?", "Paris is the capital and largest city of France."),
    ("how do bees make honey", "Bees store nectar in the hive, where it thickens into honey."),
    ("Wer schrieb den Faust?", "Johann Wolfgang von Goethe schrieb „Faust“, eine Tragödie."),
    ("a", "b"),
    ("the history of the printing press", LONG),
)
# One query with several documents: the first pair's query and the other short documents.
ONE_QUERY = (PAIRS[0][0], tuple(document for _, document in PAIRS[:-1]))

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Row:
    """One probe's served and reference values."""

    probe: str
    served: float
    reference: float

    @property
    def difference(self) -> float:
        return abs(self.served - self.reference)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A probe the served path refused (too long for the model): nothing to compare."""

    probe: str
    why: str


def probe_rows(backend: Backend, recipe: PairRecipe | LabelRecipe) -> list[Row | Skipped]:
    """Every probe through both paths, in a fixed order (the recipe was made for the backend's kind)."""
    requests = [(query, (document,)) for query, document in PAIRS] + [ONE_QUERY]
    forward = backend.forward
    if isinstance(recipe, LabelRecipe):
        assert isinstance(backend, LabelScorer)
        return [row for query, items in requests for row in _label_rows(backend, forward, recipe, query, items)]
    assert isinstance(backend, PairScorer)
    rows = [row for query, documents in requests for row in _pair_rows(backend, forward, recipe, query, documents)]
    if isinstance(recipe, EmbeddingRecipe):
        assert isinstance(backend, Embedder)
        texts = dict.fromkeys(text for pair in PAIRS for text in pair)
        rows += [_embedding_row(backend, forward, recipe, text) for text in texts]
    return rows


Forward = Callable[[Sequence[Encoded]], list[torch.Tensor]]


def _served(plan: Plan[T], forward: Forward) -> T:
    """What the engine answers: the plan's inputs encoded and run as one batch, then the plan's finish."""
    encoding = plan.encode(no_checkpoint)
    return encoding.finish(forward(encoding.inputs))


def _pair_rows(
    scorer: PairScorer, forward: Forward, recipe: PairRecipe, query: str, documents: Sequence[str]
) -> list[Row | Skipped]:
    more = "" if len(documents) == 1 else f" (1 query, {len(documents)} documents)"
    names = [_name(query, document) + more for document in documents]
    try:
        served = _served(scorer.plan_pairs([query], list(documents), PairOptions()), forward).scores
    except InputTooLong as error:
        return [Skipped(name, _too_long(error)) for name in names]
    reference = recipe.scores(query, documents)
    return [Row(name, *values) for name, values in zip(names, zip(served, reference, strict=True), strict=True)]


def _embedding_row(embedder: Embedder, forward: Forward, recipe: EmbeddingRecipe, text: str) -> Row | Skipped:
    """A text's embedding, shown at the dimension where the two paths differ most."""
    name = f"embedding of {_short(text)}"
    try:
        served = _served(embedder.plan_embed([text], EmbedOptions()), forward).vectors[0]
    except InputTooLong as error:
        return Skipped(name, _too_long(error))
    reference = recipe.embedding(text)
    worst = max(range(len(served)), key=lambda i: abs(served[i] - reference[i]))
    return Row(f"{name} [{worst}]", served[worst], reference[worst])


def _label_rows(
    scorer: LabelScorer, forward: Forward, recipe: LabelRecipe, query: str, items: Sequence[str]
) -> list[Row | Skipped]:
    """Each item's probability of each label (over the labels), after the query."""
    more = "" if len(items) == 1 else f" (1 query, {len(items)} items)"
    names = [f"{_name(query, item)}{more}: P({label})" for item in items for label in recipe.labels]
    asked = LabelQuery(query, list(items), list(recipe.labels.values()))
    served = _served(scorer.plan_labels(asked), forward)
    if served.truncated_prompts:  # cut to the model's length, as vLLM cuts it: the reference reads it whole
        return [Skipped(name, "cut to the model's length") for name in names]
    values = [value for item in items for value in recipe.probabilities(query, item)]
    found = [value for probabilities in served.probabilities for value in probabilities]
    return [Row(name, *pair) for name, pair in zip(names, zip(found, values, strict=True), strict=True)]


def table(rows: Sequence[Row | Skipped]) -> str:
    """The rows as columns: probe, served, reference, difference (a skipped probe says why)."""
    width = max(len(row.probe) for row in rows)
    lines = [f"{'probe':<{width}}  {'served':>12}  {'reference':>12}  {'difference':>10}"]
    for row in rows:
        if isinstance(row, Row):
            lines.append(f"{row.probe:<{width}}  {row.served:>12.6f}  {row.reference:>12.6f}  {row.difference:>10.1e}")
        else:
            lines.append(f"{row.probe:<{width}}  skipped: {row.why}")
    return "\n".join(lines)


def _name(query: str, document: str) -> str:
    return f"{_short(query)} | {_short(document)}"


def _short(text: str, width: int = 24) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _too_long(error: InputTooLong) -> str:
    tokens = f"{error.length} tokens" if error.length is not None else f"{error.chars} characters"
    return f"{tokens}, over the model's {error.maximum}"
