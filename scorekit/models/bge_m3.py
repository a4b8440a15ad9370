"""bge-m3 (BAAI's M3): one XLM-RoBERTa forward gives three outputs per text, each served where its kind is (the dense
vector on /v1/embeddings and /embed, the sparse weights on /embed_sparse, the ColBERT vectors on /pooling token_embed
and /embed_all), and /score and /rerank score a pair by any one of them or by a weighted sum.

Every formula is FlagEmbedding 1.4.2's (``FlagEmbedding/finetune/embedder/encoder_only/m3/modeling.py``, class
``EncoderOnlyEmbedderM3Model``, and ``FlagEmbedding/inference/embedder/encoder_only/m3.py``, class ``M3Embedder``,
which BGEM3FlagModel names), with its defaults (``normalize_embeddings=True``, no query instruction):

- dense (``_dense_embedding``, "cls"): the last hidden state at [CLS] (position 0), normalized;
- sparse (``_sparse_embedding``; ``encode_single_device``'s ``_process_token_weights``): relu(sparse_linear(hidden))
  at every token, the largest weight per token id, the tokenizer's cls, eos, pad and unk ids left out, and only
  weights above zero kept; a lexical score is the sum over the ids two vectors share of their weights' products
  (``compute_lexical_matching_score``, and ``compute_sparse_score`` on the vocabulary-wide vectors);
- ColBERT (``_colbert_embedding``; ``_process_colbert_vecs``): colbert_linear(hidden) at every token after [CLS]
  ([EOS] included), each normalized; a score is the sum over the query's vectors of the best dot product with any
  of the document's, over the query's vector count (``colbert_score``; ``compute_colbert_score`` divides by
  ``q_mask[:, 1:].sum()``, the same count);
- combined (``compute_score_single_device``), with weights w for dense, sparse and ColBERT: "sparse+dense" is
  (w[1] sparse + w[0] dense) / (w[1] + w[0]), "colbert+sparse+dense" (w[2] colbert + w[1] sparse + w[0] dense) /
  (w[0] + w[1] + w[2]).

Two choices are scorekit's. The default weights are [0.4, 0.2, 0.4], the ones bge-m3's authors pass to
``compute_score`` in its README's example (the BAAI/bge-m3 model card; FlagEmbedding's own default when none are
given, in ``compute_score_single_device``, is [1, 1, 1]), and the default
score is "colbert+sparse+dense" with them. And a document's ColBERT score never depends on the other documents of
its batch: ``compute_score`` pads a batch's documents with zero vectors that take part in each max (so a query
vector whose every real dot product is negative scores 0 beside a longer document), where ``colbert_score``, which
this follows, reads each document's own vectors only.

An input asks for the outputs its request needs, as the one label id it carries (a mask of :data:`DENSE`,
:data:`SPARSE` and :data:`COLBERT`; 0 or none, as the memory probe's inputs carry, is all three): the forward computes
those only, and answers them as one float32 row per input (see :class:`Outputs`), in this process or from a model
host process. So a /v1/embeddings request moves one vector per text, not a vector per token.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import torch
from torch.nn import functional
from transformers import AutoModel

from scorekit.errors import InvalidRequest
from scorekit.tasks import (
    Embeddings,
    EmbedOptions,
    PairOptions,
    PairScores,
    Prompt,
    ScoreMode,
    SparseEmbeddings,
    SparseOptions,
    SparseVector,
    TokenEmbeddings,
    TokenEmbedOptions,
    TruncationSide,
    Window,
)

from .base import Checkpoint, Encoded, Encoding, ModelKind, Plan, inference, located
from .embed_options import Matryoshka
from .files import Source
from .late_interaction import maxsim
from .loaded import LoadedModel
from .padding import pad_batch
from .pairs import Pairing, check_pair_options, distinct_sides, window_usage
from .sparse import dots
from .tokens import Meter
from .truncation import cut_texts, encode_text_windows, encode_texts, limits

R = TypeVar("R")
T = TypeVar("T")

# The outputs an input asks for, as bits of its one label id.
DENSE, SPARSE, COLBERT = 1, 2, 4
EVERY = DENSE | SPARSE | COLBERT
# What each score needs of a pair's two texts.
MODES: dict[ScoreMode, int] = {
    "dense": DENSE,
    "sparse": SPARSE,
    "colbert": COLBERT,
    "sparse+dense": SPARSE | DENSE,
    "colbert+sparse+dense": EVERY,
}
DEFAULT_MODE: ScoreMode = "colbert+sparse+dense"
DEFAULT_WEIGHTS = (0.4, 0.2, 0.4)  # dense, sparse, ColBERT: the README's compute_score example
# The heads FlagEmbedding loads beside the encoder's weights (EncoderOnlyEmbedderM3Runner.get_model).
COLBERT_HEAD, SPARSE_HEAD = "colbert_linear.pt", "sparse_linear.pt"


def heads_beside(source: Source) -> str | None:
    """Why ``source`` is a bge-m3 (its two heads beside a bare encoder's weights), or None when it is not; read before
    any weights, and before modules.json, which bge-m3 also ships for sentence-transformers (its dense output)."""
    if source.path_of(COLBERT_HEAD) is None or source.path_of(SPARSE_HEAD) is None:
        return None
    config = source.read_json("config.json")
    architectures = [str(name) for name in (config if isinstance(config, dict) else {}).get("architectures") or []]
    encoders = [name for name in architectures if name.endswith("Model")]
    if not encoders:
        return None
    return f"{COLBERT_HEAD} and {SPARSE_HEAD} beside an {encoders[0]} (bge-m3)"


@dataclass(frozen=True, slots=True)
class Outputs:
    """One input's outputs, as the forward packed them in one row: the dense vector's values (the [CLS] hidden
    state, not normalized), then the ColBERT vectors' (one per token after [CLS], normalized), then the sparse head's
    weight at every token (relu'd); only those the input asked for, so each part's size follows from the input's
    length. None: not asked."""

    dense: torch.Tensor | None
    colbert: torch.Tensor | None
    sparse: torch.Tensor | None  # [2, k]: the token ids (ascending, as floats) and their largest weights

    @property
    def vector(self) -> torch.Tensor:
        assert self.dense is not None
        return self.dense

    @property
    def vectors(self) -> torch.Tensor:
        assert self.colbert is not None
        return self.colbert

    @property
    def weights(self) -> torch.Tensor:
        assert self.sparse is not None
        return self.sparse


class BGEM3Backend(LoadedModel):
    """An encoder (``AutoModel``) and FlagEmbedding's two heads beside it; see the module's docstring."""

    chunks_documents = True  # scores a long document by its best window (tasks.Chunking)
    kind: ModelKind = "bge-m3"
    batch_cost_follows_tokens = True

    def __init__(self, root: Source, *, device: torch.device, dtype: torch.dtype) -> None:
        model = self.load(AutoModel, root, device, dtype)
        self._model = model
        self.hidden = int(model.config.get_text_config().hidden_size)
        self._colbert = _head(root, COLBERT_HEAD, self.hidden, None, device, dtype)
        self._sparse = _head(root, SPARSE_HEAD, self.hidden, 1, device, dtype)
        self.dimensions = int(self._colbert.out_features)
        self.matryoshka = Matryoshka.of(model.config)
        tokenizer = self._tokenizer
        left_out = (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
        self.left_out = sorted({token for token in left_out if isinstance(token, int)})
        self._left_out = torch.tensor(self.left_out, dtype=torch.long)

    def plan_embed(self, texts: list[str], options: EmbedOptions) -> Plan[Embeddings]:
        """The dense vectors, normalized unless the request says not; ``dimensions`` cuts a vector before it is
        normalized (FlagEmbedding's ``truncate_dim``)."""
        _no_prompt(options.prompt)
        normalize = True if options.normalize is None else options.normalize
        size = None if options.dimensions is None else self.matryoshka.check(options.dimensions)

        def finish(outputs: list[Outputs]) -> list[list[float]]:
            vectors = torch.stack([output.vector[:size] for output in outputs])
            rows: list[list[float]] = (functional.normalize(vectors, dim=-1) if normalize else vectors).tolist()
            return rows

        return self._per_text(texts, options.truncate, options.side, DENSE, finish, Embeddings)

    def plan_embed_sparse(self, texts: list[str], options: SparseOptions) -> Plan[SparseEmbeddings]:
        """The sparse vectors: per text, its token ids' largest weights."""
        _no_prompt(options.prompt)

        def finish(outputs: list[Outputs]) -> list[SparseVector]:
            return [SparseVector(output.weights[0].long().tolist(), output.weights[1].tolist()) for output in outputs]

        def answer(vectors: list[SparseVector], tokens: int) -> SparseEmbeddings:
            return SparseEmbeddings(vectors, tokens, self.vocab_size)

        return self._per_text(texts, options.truncate, options.side, SPARSE, finish, answer)

    def plan_token_embed(self, texts: list[str], options: TokenEmbedOptions) -> Plan[TokenEmbeddings]:
        """The ColBERT vectors, one per token after [CLS]; a query and a document are encoded alike (FlagEmbedding's
        ``encode_queries`` and ``encode_corpus`` differ only in their default lengths), so the role changes nothing."""

        def finish(outputs: list[Outputs]) -> list[list[list[float]]]:
            return [output.vectors.tolist() for output in outputs]

        return self._per_text(texts, options.truncate, options.side, COLBERT, finish, TokenEmbeddings)

    def _per_text(
        self,
        texts: list[str],
        truncate: int | None,
        side: TruncationSide | None,
        asked: int,
        finish: Callable[[list[Outputs]], list[T]],
        answer: Callable[[list[T], int], R],
    ) -> Plan[R]:
        """Each distinct text run once for the ``asked`` outputs, ``finish`` making their answers; usage counts every
        input's tokens, repeats included."""
        distinct = list(dict.fromkeys(texts))
        row_of = {text: row for row, text in enumerate(distinct)}

        def encode(checkpoint: Checkpoint) -> Encoding[R]:
            meter = Meter(checkpoint)
            with located(lambda row, _: ((1, texts.index(distinct[row])),)):
                inputs = self._encode(distinct, truncate, side, asked, meter)
            meter.close()

            def done(outputs: list[torch.Tensor]) -> R:
                found = finish([self._unpack(item, output) for item, output in zip(inputs, outputs, strict=True)])
                tokens = sum(inputs[row_of[text]].cost for text in texts)
                return answer([found[row_of[text]] for text in texts], tokens)

            return Encoding(inputs, done)

        return Plan(count=len(distinct), chars=sum(map(len, distinct)), encode=encode)

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct query and each distinct document (or window of one, with chunking) is one input, run once
        for the outputs the request's score needs; a pair's score is that score of its two texts (its document's best
        window's, the first of equal ones). ``use_activation`` means nothing here. Usage counts the query once per
        side-1 entry and every window of a document once per side-2 entry."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)
        mode, weights = scoring(options)
        asked, width = MODES[mode], self.vocab_size
        pairing = Pairing.of(side1, side2)
        queries, documents, query_row, document_row = distinct_sides(side1, side2)

        def encode(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            cut = cut_texts(self._tokens, queries, options.query_tokens, meter)
            with located(lambda row, _: ((0, side1.index(queries[row])),)):
                query_inputs = self._encode(cut, options.truncate, options.side, asked, meter)
            read = cut_texts(self._tokens, documents, options.document_tokens, meter)
            if options.chunking is None:
                with located(lambda row, _: ((1, side2.index(documents[row])),)):
                    document_inputs = self._encode(read, options.truncate, options.side, asked, meter)
                spans = [[(0, len(text))] for text in documents]
            else:
                windows, spans = encode_text_windows(self._tokens, read, self.max_length, options.chunking, meter)
                document_inputs = [replace(item, label_token_ids=(asked,)) for item in windows]
            meter.close()
            inputs = query_inputs + document_inputs
            return Encoding(inputs, lambda outputs: finish(inputs, spans, outputs))

        def finish(
            inputs: list[Encoded], spans: list[list[tuple[int, int]]], outputs: list[torch.Tensor]
        ) -> PairScores:
            found = [self._unpack(item, output) for item, output in zip(inputs, outputs, strict=True)]
            # Where each distinct document's windows start among the inputs (the queries' come first).
            starts = list(itertools.accumulate((len(ranges) for ranges in spans), initial=len(queries)))
            scores: list[float] = [0.0] * len(pairing.distinct)
            which: list[Window] = [Window(0, 1, 0, 0)] * len(pairing.distinct)
            by_query: dict[str, list[int]] = {}
            for row, (query, _) in enumerate(pairing.distinct):
                by_query.setdefault(query, []).append(row)
            for query, rows in by_query.items():  # each distinct query against all its documents' windows at once
                owned = [document_row[pairing.distinct[row][1]] for row in rows]
                places = [place for document in owned for place in range(starts[document], starts[document + 1])]
                values = iter(combined(mode, weights, found[query_row[query]], [found[i] for i in places], width))
                for row, document in zip(rows, owned, strict=True):
                    mine = [next(values) for _ in spans[document]]
                    best = max(range(len(mine)), key=lambda i: (mine[i], -i))  # the first of equal maxima
                    scores[row] = mine[best]
                    which[row] = Window(best, len(mine), *spans[document][best])
            tokens = window_usage(inputs, side1, side2, query_row, document_row, starts)
            chunked = options.chunking is not None
            return PairScores(pairing.spread(scores), tokens, pairing.spread(which) if chunked else None)

        return Plan(count=len(queries) + len(documents), chars=sum(map(len, queries + documents)), encode=encode)

    def _encode(
        self, texts: Sequence[str], truncate: int | None, side: TruncationSide | None, asked: int, meter: Meter
    ) -> list[Encoded]:
        """Each text with the tokenizer's special tokens, checked against the model's length or cut to the request's,
        asking for the ``asked`` outputs."""
        encoded = encode_texts(self._tokens, texts, limits(self._tokens, truncate, side, self.max_length), meter)
        return [replace(item, label_token_ids=(asked,)) for item in encoded]

    def _unpack(self, item: Encoded, output: torch.Tensor) -> Outputs:
        """``output``'s parts (see :class:`Outputs`), the sparse weights made a sparse vector from ``item``'s ids."""
        asked, length = outputs_of(item), len(item.input_ids)
        sizes = [
            self.hidden if asked & DENSE else 0,
            (length - 1) * self.dimensions if asked & COLBERT else 0,
            length if asked & SPARSE else 0,
        ]
        dense, colbert, weights = torch.split(output, sizes)
        return Outputs(
            dense if asked & DENSE else None,
            colbert.view(length - 1, self.dimensions) if asked & COLBERT else None,
            lexical(item.input_ids, weights, self._left_out) if asked & SPARSE else None,
        )

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """One transformer forward for the batch, then each head on the rows that asked for its output; each input's
        outputs as one float32 row on the CPU (see :class:`Outputs`)."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        hidden = self._model(**inputs).last_hidden_state
        asked = [outputs_of(item) for item in batch]
        parts: list[list[torch.Tensor]] = [[] for _ in batch]

        def rows(output: int) -> tuple[list[int], torch.Tensor]:
            """The rows that asked for ``output``, and their hidden states (no copy when every row did)."""
            found = [row for row, wanted in enumerate(asked) if wanted & output]
            return found, hidden if len(found) == len(batch) else hidden[found]

        dense_rows, states = rows(DENSE)
        if dense_rows:
            for row, vector in zip(dense_rows, states[:, 0].float().cpu(), strict=True):
                parts[row].append(vector)
        colbert_rows, states = rows(COLBERT)
        if colbert_rows:
            vectors = functional.normalize(self._colbert(states[:, 1:]).float(), dim=-1).cpu()
            for row, found in zip(colbert_rows, vectors, strict=True):
                parts[row].append(found[: len(batch[row].input_ids) - 1].reshape(-1))
        sparse_rows, states = rows(SPARSE)
        if sparse_rows:
            weights = torch.relu(self._sparse(states)).squeeze(-1).float().cpu()
            for row, found in zip(sparse_rows, weights, strict=True):
                parts[row].append(found[: len(batch[row].input_ids)])
        return [torch.cat(found) for found in parts]


def outputs_of(item: Encoded) -> int:
    """The outputs ``item`` asks for (its one label id); none named, as a memory probe's input: all of them."""
    asked = functools.reduce(operator.or_, item.label_token_ids, 0) & EVERY
    return asked or EVERY


def lexical(ids: array[int], weights: torch.Tensor, left_out: torch.Tensor) -> torch.Tensor:
    """A text's sparse vector from its tokens' weights: per token id, its largest weight above zero, the ids in
    ``left_out`` (the special tokens) dropped; two rows, the ids ascending (as floats) and their weights."""
    tokens = torch.frombuffer(ids, dtype=torch.int32).long() if len(ids) else torch.empty(0, dtype=torch.long)
    kept = (weights > 0) & ~torch.isin(tokens, left_out)
    unique, inverse = torch.unique(tokens[kept], sorted=True, return_inverse=True)
    largest = torch.zeros(len(unique)).scatter_reduce_(0, inverse, weights[kept], "amax", include_self=False)
    return torch.stack([unique.float(), largest])


def scoring(options: PairOptions) -> tuple[ScoreMode, tuple[float, float, float]]:
    """The request's score and weights, or its error naming the field: weights weigh a combined score only, each
    finite and not negative, those the score sums not all zero."""
    mode = options.score_mode or DEFAULT_MODE
    if options.score_weights is None:
        return mode, DEFAULT_WEIGHTS
    if mode not in ("sparse+dense", "colbert+sparse+dense"):
        raise InvalidRequest(
            f"score_weights weighs a combined score (score_mode sparse+dense or colbert+sparse+dense); {mode} is one"
            " score alone.",
            "score_weights",
        )
    if len(options.score_weights) != 3:
        raise InvalidRequest("score_weights holds 3 weights: dense, sparse and ColBERT.", "score_weights")
    dense, sparse, colbert = options.score_weights
    if not all(math.isfinite(weight) and weight >= 0 for weight in (dense, sparse, colbert)):
        raise InvalidRequest("Each of score_weights must be a finite number, 0 or more.", "score_weights")
    if not math.isfinite(dense + sparse + colbert):
        raise InvalidRequest("The sum of score_weights must be a finite number.", "score_weights")
    if dense + sparse + (colbert if mode == "colbert+sparse+dense" else 0.0) <= 0:
        raise InvalidRequest(f"The weights {mode} sums must not all be 0.", "score_weights")
    return mode, (dense, sparse, colbert)


def combined(
    mode: ScoreMode, weights: tuple[float, float, float], query: Outputs, documents: list[Outputs], width: int
) -> list[float]:
    """The query's ``mode`` score with each document (see the module's docstring); ``width``: the vocabulary's size."""
    asked, count = MODES[mode], len(documents)
    dense = sparse = colbert = [0.0] * count
    if asked & DENSE and documents:
        rows = functional.normalize(torch.stack([document.vector for document in documents]), dim=-1)
        dense = (rows @ functional.normalize(query.vector, dim=-1)).tolist()
    if asked & SPARSE:
        pairs = [(0, document) for document in range(count)]
        sparse = dots([query.weights], [document.weights for document in documents], pairs, width)
    if asked & COLBERT:
        colbert = maxsim(query.vectors, [document.vectors for document in documents], mean=True).tolist()
    if mode in ("dense", "sparse", "colbert"):
        return {"dense": dense, "sparse": sparse, "colbert": colbert}[mode]
    w_dense, w_sparse, w_colbert = weights
    if mode == "sparse+dense":
        w_colbert = 0.0  # its sum is over the dense and sparse weights only
    total = w_dense + w_sparse + w_colbert
    # Each weight over the sum first: FlagEmbedding's weighted sum over the sum, which no large weight can overflow.
    w_dense, w_sparse, w_colbert = w_dense / total, w_sparse / total, w_colbert / total
    return [d * w_dense + s * w_sparse + c * w_colbert for d, s, c in zip(dense, sparse, colbert, strict=True)]


def _no_prompt(prompt: Prompt | None) -> None:
    """bge-m3 puts nothing before a text (FlagEmbedding's recipe has no prompt): a prompt the request names is refused;
    one it wants only where saved (Cohere's ``input_type``) is none."""
    if prompt is not None and not prompt.if_saved:
        raise InvalidRequest(
            f"A bge-m3 puts no prompt before its texts (FlagEmbedding's recipe has none); leave {prompt.field} out.",
            prompt.field,
        )


def _head(
    root: Source, filename: str, hidden: int, out: int | None, device: torch.device, dtype: torch.dtype
) -> torch.nn.Linear:
    """One of FlagEmbedding's heads: a Linear from the hidden size (to ``out``, when it must be that), its state saved
    by ``torch.save`` beside the encoder's weights; on the meta device, its shape alone."""
    path = root.path_of(filename)
    if path is None:
        raise ValueError(
            f"Model {root.name!r} has no {filename} beside its weights: a bge-m3 folder has {COLBERT_HEAD} and"
            f" {SPARSE_HEAD}, FlagEmbedding's heads."
        )
    try:
        state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
        weight = state["weight"]
        rows, columns = weight.shape
        head = torch.nn.Linear(columns, rows, bias="bias" in state)
        head.load_state_dict(state)
    except Exception as exc:  # a pickle torch refuses, a missing key, a shape the Linear refuses
        raise ValueError(
            f"Model {root.name!r}: its {filename} is no Linear layer's state ({type(exc).__name__})."
        ) from exc
    if columns != hidden or (out is not None and rows != out):
        wanted = f"{hidden} to {out}" if out is not None else f"{hidden} to any width"
        raise ValueError(
            f"Model {root.name!r}: its {filename} maps {columns} to {rows}, not {wanted} (the hidden size)."
        )
    return head.to(device=device, dtype=dtype).eval()
