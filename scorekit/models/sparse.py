"""A sparse encoder (SPLADE), as sentence-transformers' SparseEncoder computes it: a masked-LM's logits over the
vocabulary at every token, through ReLU and log1p, pooled over the tokens (max, or sum) into one weight per token
id, most of them zero; served as it is (TEI's /embed_sparse) and as the dot product of two of them (/score,
/rerank).

A pair's query is encoded as ``SparseEncoder.encode_query`` encodes it and its document as ``encode_document`` does
(their saved prompts, and an inference-free model's routes: a query's vector is then the static weights of its
tokens, and no model runs for it); an /embed_sparse text as ``encode`` does (the prompt it names or the default one,
and the Router's default route). A saved ``max_active_dims`` keeps each vector's largest weights only, as
``encode`` does.

A forward's output per input is its vector's non-zero entries as one float32 tensor of two rows, the token ids
(exact: float32 holds every integer below 2**24, far above any vocabulary) and their weights, so a batch's
answers and a model host process's messages carry a few hundred numbers per input, not the vocabulary's tens of
thousands.
"""

from __future__ import annotations

import itertools
from array import array
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import AutoModelForMaskedLM

from scorekit.errors import InvalidRequest
from scorekit.tasks import (
    Chunking,
    PairOptions,
    PairScores,
    Prompt,
    SparseEmbeddings,
    SparseOptions,
    SparseVector,
    TruncationSide,
    Window,
)

from .base import Checkpoint, Encoded, Encoding, ModelKind, Plan, inference, located
from .embed_options import SavedPrompts
from .files import Source, load_tokenizer
from .loaded import LoadedModel
from .padding import pad_batch
from .pairs import Pairing, check_pair_options, distinct_sides
from .sparse_layout import SavedSparse, SparseLayout, read_layout, static_weights
from .tokens import Meter, Part, Template, TextTokenizer
from .truncation import cut_texts, encode_text_windows, encode_texts, limits

# The most bytes of float32 logits one pass of the masked-LM makes: a batch's rows run in passes of as many rows as
# fit (at least one), since the logits are as wide as the vocabulary (30522 wide for BERT: 62 MB per input of 512
# tokens), where a bi-encoder's hidden states are a few hundred wide.
LOGITS_BYTES = 256 << 20
# The prompts SparseEncoder's encode_query and encode_document put before a text (empty unless the model saved one).
QUERY, DOCUMENT = Prompt("query"), Prompt("document")
_NONE = Part(array("i"), array("i"))
# No special tokens: how a SparseStaticEmbedding tokenizes (add_special_tokens=False).
BARE = Template((_NONE, _NONE), 0, (_NONE, _NONE, _NONE), (0, 0))


class StaticQueries:
    """An inference-free model's query route (sentence-transformers' SparseStaticEmbedding): a query's vector is
    the saved weight of each token id it holds, every other zero; its tokenizer adds no special tokens."""

    def __init__(self, folder: Source, keep: int | None) -> None:
        self.tokens = TextTokenizer(load_tokenizer(folder), joins=False)
        self.weight = static_weights(folder)
        self._keep = keep

    def vector(self, ids: array[int]) -> torch.Tensor:
        """The query's sparse vector (see the module's docstring) from its token ids."""
        present = torch.tensor(ids, dtype=torch.long)
        dense = torch.zeros_like(self.weight)
        dense[present] = self.weight[present]
        return sparse_rows(dense[None], self._keep)[0]


@dataclass(frozen=True, slots=True)
class _Side:
    """How one side of a request is encoded: the prompt before each text, and its route (``static``: a
    SparseStaticEmbedding's, which runs no model; None: the masked-LM's)."""

    prompt: str
    static: StaticQueries | None = None


class SparseEncoderBackend(LoadedModel):
    """A masked-LM and its SpladePooling, read from a SparseEncoder folder (or a plain masked-LM folder, pooled
    with SpladePooling's defaults, as SparseEncoder loads one); see the module's docstring."""

    chunks_documents = True  # scores a long document by its best window's dot product (tasks.Chunking)
    kind: ModelKind = "sparse-encoder"
    batch_cost_follows_tokens = True

    def __init__(self, root: Source, *, device: torch.device, dtype: torch.dtype) -> None:
        name = root.name
        self.layout: SparseLayout = read_layout(root)
        self.saved = SavedSparse.read(Source(name))
        self.prompts = SavedPrompts.read(Source(name))
        self._model = self.load(
            AutoModelForMaskedLM, Source(name, self.layout.mlm, root.trust_remote_code), device, dtype
        )
        query_route = self.layout.query_route
        keep = self.saved.max_active_dims
        self.queries = None if query_route is None else StaticQueries(Source(name, query_route), keep)
        # Every vector's width: the logits' (the vocabulary), or a static route's weights, whichever is wider.
        self.width = max(self.vocab_size, 0 if self.queries is None else len(self.queries.weight))

    def plan_embed_sparse(self, texts: list[str], options: SparseOptions) -> Plan[SparseEmbeddings]:
        """Each distinct text is run once; usage counts every input's tokens, repeats included (as vLLM), the
        prompt's too. The route is the Router's default one (documents', unless it says otherwise)."""
        route = self.layout.default_route
        if route is None:
            raise InvalidRequest(
                "The model's Router has no default route, so it embeds a text only as a query or a document: "
                "score pairs with /score or /rerank, where queries and documents each take their own route."
            )
        side = _Side(self.prompts.text(options.prompt), self.queries if route == "query" else None)
        distinct = list(dict.fromkeys(texts))
        row_of = {text: i for i, text in enumerate(distinct)}

        def finish(items: list[Encoded], outputs: list[torch.Tensor]) -> SparseEmbeddings:
            vectors = [_vector(row) for row in self._vectors(side, items, iter(outputs))]
            tokens = sum(items[row_of[text]].cost for text in texts)
            return SparseEmbeddings([vectors[row_of[text]] for text in texts], tokens, self.width)

        def encode(checkpoint: Checkpoint) -> Encoding[SparseEmbeddings]:
            meter = Meter(checkpoint)
            with located(lambda row, _: ((1, texts.index(distinct[row])),)):
                items = self._encode(side, distinct, options.truncate, options.side, meter)
            meter.close()
            return Encoding(self._inputs(side, items), lambda outputs: finish(items, outputs))

        chars = sum(map(len, distinct)) + len(side.prompt) * len(distinct)
        return Plan(count=len(distinct) if side.static is None else 0, chars=chars, encode=encode)

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct query and each distinct document is encoded once (a 1:N request's query once); a pair's
        score is the dot product of its two sparse vectors. ``use_activation`` means nothing here. With chunking,
        see :meth:`_plan_windowed`."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)
        queries_side = _Side(self.prompts.text(QUERY), self.queries)
        documents_side = _Side(self.prompts.text(DOCUMENT))
        if options.chunking is not None:
            return self._plan_windowed(side1, side2, options, options.chunking, queries_side, documents_side)
        pairing = Pairing.of(side1, side2)
        queries, documents, query_row, document_row = distinct_sides(side1, side2)

        def encode(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            query_items = self._encode_queries(queries_side, queries, side1, options, meter)
            read = cut_texts(self._tokens, documents, options.document_tokens, meter)
            with located(lambda row, _: ((1, side2.index(documents[row])),)):
                document_items = self._encode(documents_side, read, options.truncate, options.side, meter)
            meter.close()
            inputs = self._inputs(queries_side, query_items) + document_items
            return Encoding(inputs, lambda outputs: finish(query_items, document_items, outputs))

        def finish(
            query_items: list[Encoded], document_items: list[Encoded], outputs: list[torch.Tensor]
        ) -> PairScores:
            rows = iter(outputs)
            query_vectors = self._vectors(queries_side, query_items, rows)
            document_vectors = self._vectors(documents_side, document_items, rows)
            pairs = [(query_row[query], document_row[document]) for query, document in pairing.distinct]
            scores = dots(query_vectors, document_vectors, pairs, self.width)
            tokens = sum(query_items[query_row[text]].cost for text in side1)  # the query once per side-1 entry
            tokens += sum(document_items[document_row[text]].cost for text in side2)
            return PairScores(pairing.spread(scores), tokens)

        chars = sum(map(len, queries + documents))
        chars += len(queries_side.prompt) * len(queries) + len(documents_side.prompt) * len(documents)
        count = (len(queries) if queries_side.static is None else 0) + len(documents)
        return Plan(count=count, chars=chars, encode=encode)

    def _plan_windowed(
        self,
        side1: list[str],
        side2: list[str],
        options: PairOptions,
        chunking: Chunking,
        queries_side: _Side,
        documents_side: _Side,
    ) -> Plan[PairScores]:
        """A long document scored by windows, by the bi-encoder's rule: each distinct query encoded once (checked
        or cut as without chunking), each distinct document as windows of its tokens that each fit the model,
        every window an input of its own; a pair's score is the best dot product of its query with its document's
        windows (the first of equal ones), and which window won. Usage counts the query once per side-1 entry and
        every window of a document once per side-2 entry, as vLLM counts every pair. A saved document prompt would
        stand before the first window only, so a model with one is refused."""
        if documents_side.prompt:
            raise InvalidRequest(
                "This model puts its saved document prompt before each document, and a window of a document would "
                "lack it: cut long documents with truncate_prompt_tokens instead.",
                "max_chunks_per_doc",
            )
        pairing = Pairing.of(side1, side2)
        queries, documents, query_row, document_row = distinct_sides(side1, side2)

        def encode(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            query_items = self._encode_queries(queries_side, queries, side1, options, meter)
            read = cut_texts(self._tokens, documents, options.document_tokens, meter)
            windows, spans = encode_text_windows(self._tokens, read, self.max_length, chunking, meter)
            meter.close()
            inputs = self._inputs(queries_side, query_items) + windows
            return Encoding(inputs, lambda outputs: finish(query_items, windows, spans, outputs))

        def finish(
            query_items: list[Encoded],
            windows: list[Encoded],
            spans: list[list[tuple[int, int]]],
            outputs: list[torch.Tensor],
        ) -> PairScores:
            rows = iter(outputs)
            query_vectors = self._vectors(queries_side, query_items, rows)
            window_vectors = [next(rows) for _ in windows]
            # Where each distinct document's windows start among the windows.
            starts = list(itertools.accumulate((len(ranges) for ranges in spans), initial=0))
            pairs = [
                (query_row[query], window)
                for query, document in pairing.distinct
                for window in range(starts[document_row[document]], starts[document_row[document] + 1])
            ]
            products = iter(dots(query_vectors, window_vectors, pairs, self.width))
            scores, which = [], []
            for _, document in pairing.distinct:
                ranges = spans[document_row[document]]
                found = [next(products) for _ in ranges]
                best = max(range(len(found)), key=found.__getitem__)  # the first of equal maxima
                scores.append(found[best])
                which.append(Window(best, len(ranges), *ranges[best]))
            tokens = sum(query_items[query_row[text]].cost for text in side1)
            for text in side2:
                row = document_row[text]
                tokens += sum(item.cost for item in windows[starts[row] : starts[row + 1]])
            return PairScores(pairing.spread(scores), tokens, pairing.spread(which))

        chars = sum(map(len, queries + documents)) + len(queries_side.prompt) * len(queries)
        count = (len(queries) if queries_side.static is None else 0) + len(documents)
        return Plan(count=count, chars=chars, encode=encode)

    def _encode_queries(
        self, side: _Side, queries: list[str], side1: list[str], options: PairOptions, meter: Meter
    ) -> list[Encoded]:
        """The distinct queries, each cut to ``max_tokens_per_query`` by its route's tokenizer, then encoded."""
        tokens = self._tokens if side.static is None else side.static.tokens
        asked = cut_texts(tokens, queries, options.query_tokens, meter)
        with located(lambda row, _: ((0, side1.index(queries[row])),)):
            return self._encode(side, asked, options.truncate, options.side, meter)

    def _encode(
        self, side: _Side, texts: Sequence[str], truncate: int | None, cut: TruncationSide | None, meter: Meter
    ) -> list[Encoded]:
        """Each text, its side's prompt before it, as its route reads it: the masked-LM's input with the
        tokenizer's special tokens, or a static route's bare tokens; checked against the model's length or cut."""
        prompted = [side.prompt + text for text in texts]
        if side.static is None:
            return encode_texts(self._tokens, prompted, limits(self._tokens, truncate, cut, self.max_length), meter)
        tokens = side.static.tokens
        request_limits = limits(tokens, truncate, cut, self.max_length)
        return encode_texts(tokens, prompted, request_limits, meter, template=BARE)

    @staticmethod
    def _inputs(side: _Side, items: list[Encoded]) -> list[Encoded]:
        """What of a side's encoded texts the model runs: all of the masked-LM's, none of a static route's."""
        return items if side.static is None else []

    @staticmethod
    def _vectors(side: _Side, items: list[Encoded], outputs: Iterator[torch.Tensor]) -> list[torch.Tensor]:
        """A side's vectors, in its items' order: the next outputs of the batch for the masked-LM's, each computed
        from its token ids for a static route's."""
        if side.static is None:
            return [next(outputs) for _ in items]
        return [side.static.vector(item.input_ids) for item in items]

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """Each input's sparse vector as two rows, its token ids and their weights, on the CPU."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        length = inputs["input_ids"].shape[1]
        rows = max(1, LOGITS_BYTES // (4 * length * self.vocab_size))
        pooled = [
            self._pool({key: value[start : start + rows] for key, value in inputs.items()})
            for start in range(0, len(batch), rows)
        ]
        return sparse_rows(torch.cat(pooled).cpu(), self.saved.max_active_dims)

    def _pool(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """SpladePooling over one pass's rows: log1p(relu(logits)) (twice log1p for ``log1p_relu``), padding
        zeroed, the maximum or the sum over the tokens; in float32 whatever the model's dtype."""
        logits: torch.Tensor = self._model(**inputs).logits.float()
        weights = (logits * inputs["attention_mask"].unsqueeze(-1)).relu_().log1p_()
        head = self.layout.head
        if head.activation == "log1p_relu":
            weights.log1p_()
        return weights.amax(dim=1) if head.strategy == "max" else weights.sum(dim=1)


def sparse_rows(dense: torch.Tensor, keep: int | None) -> list[torch.Tensor]:
    """Each row of ``dense`` as its non-zero entries (two rows: ids ascending, weights); with ``keep``, only the
    row's ``keep`` largest weights by magnitude, as sentence-transformers' ``select_max_active_dims`` keeps them."""
    if keep is not None and keep < dense.shape[-1]:
        top = dense.abs().topk(keep, dim=-1).indices
        dense = torch.zeros_like(dense).scatter_(-1, top, dense.gather(-1, top))
    vectors = []
    for row in dense:
        ids = row.nonzero().squeeze(1)
        vectors.append(torch.stack([ids.float(), row[ids]]))
    return vectors


def dots(
    queries: list[torch.Tensor], documents: list[torch.Tensor], pairs: list[tuple[int, int]], width: int
) -> list[float]:
    """The dot product of ``queries[q]`` and ``documents[d]`` for each pair (q, d): each query's weights are spread
    once into a vector of ``width`` zeros, and each of its documents gathers them at its own ids."""
    scores = [0.0] * len(pairs)
    by_query: defaultdict[int, list[int]] = defaultdict(list)
    for place, (query, _) in enumerate(pairs):
        by_query[query].append(place)
    spread = torch.zeros(width)
    for query, places in by_query.items():
        ids = queries[query][0].long()
        spread[ids] = queries[query][1]
        for place in places:
            document = documents[pairs[place][1]]
            scores[place] = float(spread[document[0].long()].dot(document[1]))
        spread[ids] = 0.0
    return scores


def _vector(row: torch.Tensor) -> SparseVector:
    ids: list[int] = row[0].long().tolist()
    values: list[float] = row[1].tolist()
    return SparseVector(ids, values)
