"""Late interaction (ColBERT): one vector per token, a pair scored by MaxSim, the sum over the query's vectors of
the best dot product with any of the document's, as PyLate, colbert-ai and sentence-transformers compute it
(``models/late_layout.py`` reads how the folder turns a text into vectors).

A query and a document are encoded apart, each with its own marker and limit: a request's distinct queries and
distinct documents (or each window of a long document) are each one model input, run once, so a 1:N request
encodes its query once and scores all N documents in one batched MaxSim. The forward answers every token's
vector, normalized; which of them count (a document's punctuation does not) is read off the input's ids when the
request is finished.

A query's expansion tokens that attention does not see (ColBERT's [MASK] padding, whose outputs still count)
travel in the input as their id's complement (``~id``, below zero): the forward knows them from the ids alone,
in this process or in a model host process, and gives the model their true id with attention masked.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional
from torch.nn.utils.rnn import pad_sequence
from transformers import AutoModel, PretrainedConfig, PreTrainedTokenizerBase

from scorekit.errors import InputTooLong, InvalidRequest
from scorekit.tasks import Chunking, PairOptions, PairScores, TokenEmbeddings, TokenEmbedOptions, TokenRole, Window

from .base import Checkpoint, Encoded, Encoding, Limits, ModelKind, Plan, inference, located
from .files import Source
from .late_layout import Role, read_layout, transformer_folder
from .loaded import LoadedModel
from .padding import pad_batch
from .pairs import Pairing, check_pair_options, distinct_sides, window_usage
from .tokens import Meter, Tokens
from .truncation import MAX_CHARS_PER_TOKEN, cut_texts, limits
from .windows import token_windows

# What a document none of whose tokens counts scores (sentence-transformers' rule): below every real document.
EMPTY_DOCUMENT_SCORE = -1e9
# MaxSim runs on blocks of documents whose similarities hold at most this many values (64 MiB of float32).
BLOCK_VALUES = 1 << 24


class LateInteractionBackend(LoadedModel):
    """A ColBERT model in any of its layouts: its transformer (``AutoModel``), its projections and its recipe
    (:class:`~.late_layout.Layout`). Scores pairs (MaxSim) and answers per-token vectors (/pooling, /embed_all)."""

    chunks_documents = True  # scores a long document by its best window (tasks.Chunking)
    kind: ModelKind = "late-interaction"
    batch_cost_follows_tokens = True

    def __init__(self, root: Source, *, device: torch.device, dtype: torch.dtype) -> None:
        transformer = Source(root.name, transformer_folder(root), root.trust_remote_code)
        model = self.load(AutoModel, transformer, device, dtype)
        self.layout = read_layout(root, self._tokenizer, _own_length(self._tokenizer, model.config), device, dtype)
        self.max_length, self.length_from = self.layout.document.limit, self.layout.length_from
        self._model = model
        self._projections = self.layout.projections
        self._skips = {role: _ids(self._role(role).skip) for role in ("query", "document")}

    @property
    def dimensions(self) -> int:
        """The width of a token vector."""
        width = int(self._projections[-1].linear.out_features)
        return min(width, self.layout.dimensions or width)

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct query and each distinct document (or window of one) is one input, run once; a pair's score
        is the MaxSim of its query's vectors and its document's (its best window's, the first of equal ones, with
        chunking). ``use_activation`` means nothing here. Usage counts the query once per side-1 entry, expansion
        included, and every window of a document once per side-2 entry."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)
        pairing = Pairing.of(side1, side2)
        queries, documents, query_row, document_row = distinct_sides(side1, side2)

        def encode(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            request = limits(self._tokens, options.truncate, options.side, self.max_length)
            asked = cut_texts(self._tokens, queries, options.query_tokens, meter)
            with located(lambda row, _: ((0, side1.index(queries[row])),)):
                query_inputs = self._encode(asked, "query", request, meter)
            read = cut_texts(self._tokens, documents, options.document_tokens, meter)
            if options.chunking is None:
                with located(lambda row, _: ((1, side2.index(documents[row])),)):
                    document_inputs = self._encode(read, "document", request, meter)
                spans = [[(0, len(text))] for text in documents]
            else:
                document_inputs, spans = self._windows(read, options.chunking, meter)
            meter.close()
            inputs = query_inputs + document_inputs
            return Encoding(inputs, lambda outputs: finish(inputs, spans, outputs))

        def finish(
            inputs: list[Encoded], spans: list[list[tuple[int, int]]], outputs: list[torch.Tensor]
        ) -> PairScores:
            split = len(queries)
            vectors = self._counted(inputs[:split], outputs[:split], "query")
            vectors += self._counted(inputs[split:], outputs[split:], "document")
            # Where each distinct document's windows start among the inputs (the queries' come first).
            starts = list(itertools.accumulate((len(ranges) for ranges in spans), initial=len(queries)))
            scores: list[float] = [0.0] * len(pairing.distinct)
            which: list[Window] = [Window(0, 1, 0, 0)] * len(pairing.distinct)
            by_query: dict[str, list[int]] = {}
            for row, (query, _) in enumerate(pairing.distinct):
                by_query.setdefault(query, []).append(row)
            for query, rows in by_query.items():  # one batched MaxSim per distinct query over all its windows
                owned = [document_row[pairing.distinct[row][1]] for row in rows]
                windows = [vectors[i] for document in owned for i in range(starts[document], starts[document + 1])]
                sims = maxsim(vectors[query_row[query]], windows, mean=self.layout.mean).tolist()
                first = 0
                for row, document in zip(rows, owned, strict=True):
                    count = starts[document + 1] - starts[document]
                    mine = sims[first : first + count]
                    best = max(range(count), key=lambda i: (mine[i], -i))  # the first of equal maxima
                    scores[row] = mine[best]
                    which[row] = Window(best, count, *spans[document][best])
                    first += count
            tokens = window_usage(inputs, side1, side2, query_row, document_row, starts)
            chunked = options.chunking is not None
            return PairScores(pairing.spread(scores), tokens, pairing.spread(which) if chunked else None)

        return Plan(count=len(queries) + len(documents), chars=sum(map(len, queries + documents)), encode=encode)

    def plan_token_embed(self, texts: list[str], options: TokenEmbedOptions) -> Plan[TokenEmbeddings]:
        """Each distinct text's vectors as its role encodes them (the ones that count: a document's without its
        skiplist tokens, a query's with its expansion), run once; usage counts every input, repeats included."""
        distinct = list(dict.fromkeys(texts))
        row_of = {text: row for row, text in enumerate(distinct)}
        role = options.role

        def encode(checkpoint: Checkpoint) -> Encoding[TokenEmbeddings]:
            meter = Meter(checkpoint)
            request = limits(self._tokens, options.truncate, options.side, self.max_length)
            with located(lambda row, _: ((1, texts.index(distinct[row])),)):
                inputs = self._encode(distinct, role, request, meter)
            meter.close()

            def finish(outputs: list[torch.Tensor]) -> TokenEmbeddings:
                rows = [vectors.tolist() for vectors in self._counted(inputs, outputs, role)]
                tokens = sum(inputs[row_of[text]].cost for text in texts)
                return TokenEmbeddings([rows[row_of[text]] for text in texts], tokens)

            return Encoding(inputs, finish)

        return Plan(count=len(distinct), chars=sum(map(len, distinct)), encode=encode)

    def _role(self, role: TokenRole) -> Role:
        return self.layout.query if role == "query" else self.layout.document

    def _encode(self, texts: Sequence[str], role: TokenRole, request: Limits, meter: Meter) -> list[Encoded]:
        """Each text as one input of ``role``, checked against its limit or cut to the request's (never past the
        role's own limit, so a query keeps at most its length); a query then expanded."""
        recipe = self._role(role)
        limit = min(recipe.limit, self.max_length)
        keep = None if request.keep is None else min(request.keep, limit)
        prepared = [recipe.text(text) for text in texts]
        if keep is None:
            for index, text in enumerate(prepared):
                if len(text) > limit * MAX_CHARS_PER_TOKEN:
                    raise InputTooLong(index, None, limit, chars=len(text))
        specials = self._specials(recipe)
        encoded = []
        cap = None if keep is None else limit + 1
        for index, tokens in enumerate(self._tokens.content(prepared, meter, cap=cap, side=request.side)):
            meter.spend(min(len(tokens.ids), limit))
            total = tokens.count + specials
            content, cut = tokens.ids, False
            if keep is None and total > limit:
                raise InputTooLong(index, total, limit)
            if keep is not None and total > keep:
                if keep < specials:
                    raise InvalidRequest(
                        f"truncate_prompt_tokens must be at least {specials} for this model.", "truncate_prompt_tokens"
                    )
                content, cut = tokens.kept(keep - specials, request.side), True
            encoded.append(self._join(recipe, content, role, truncated=cut))
        return encoded

    def _windows(
        self, texts: Sequence[str], chunking: Chunking, meter: Meter
    ) -> tuple[list[Encoded], list[list[tuple[int, int]]]]:
        """Each document as windows of its tokens that each fit its limit beside its marker, special tokens and
        prompt (whose tokens lead every window); and each window's character range in the document as sent."""
        recipe = self.layout.document
        limit = min(recipe.limit, self.max_length)
        prepared = [_Prepared.of(recipe, text) for text in texts]
        found = self._tokens.content([item.text for item in prepared], meter, offsets=True)
        encoded: list[Encoded] = []
        spans: list[list[tuple[int, int]]] = []
        for item, tokens in zip(prepared, found, strict=True):
            lead = sum(1 for start in tokens.starts if start < item.start)  # the prompt's tokens
            room = limit - self._specials(recipe) - lead
            if room < 1:
                raise InvalidRequest("The model's document prompt leaves no room for a document's text in a window.")
            body = _Tokens(tokens, lead)
            windows = token_windows(body.count, room, chunking)
            for low, high in windows:
                meter.spend(lead + high - low)
                encoded.append(self._join(recipe, tokens.ids[:lead] + body.ids[low:high], "document"))
            spans.append([item.span(body, low, high) for low, high in windows])
        return encoded, spans

    def _specials(self, recipe: Role) -> int:
        before, after = self._tokens.template.single
        return len(before.ids) + len(recipe.marker) + len(after.ids)

    def _join(self, recipe: Role, content: array[int], role: TokenRole, *, truncated: bool = False) -> Encoded:
        """The leading special tokens, the marker, the content and the trailing special tokens; a query shorter than
        its expansion length padded with the expansion token (complemented when attention does not see it)."""
        template = self._tokens.template
        before, after = template.single
        ids = before.ids + recipe.marker + content + after.ids
        expansion = self.layout.expansion
        pad = expansion.length - len(ids) if expansion is not None and role == "query" else 0
        if pad > 0 and expansion is not None:
            ids += array("i", [expansion.token if expansion.attend else ~expansion.token]) * pad
        if not self._tokens.with_types:
            return Encoded(ids, None, truncated=truncated)
        types = before.types + array("i", [0]) * len(recipe.marker)
        types += array("i", [template.single_type]) * len(content) + after.types + array("i", [0]) * max(pad, 0)
        return Encoded(ids, types, truncated=truncated)

    def _counted(self, items: Sequence[Encoded], outputs: list[torch.Tensor], role: TokenRole) -> list[torch.Tensor]:
        """The vectors of each item's tokens that count for its role: all but its skiplist tokens. One pass over
        the request's ids and vectors, not one per input (this runs on the event loop)."""
        skip = self._skips[role]
        joined = bytearray().join(item.input_ids for item in items)
        if skip is None or not joined:  # frombuffer refuses an empty buffer
            return list(outputs)
        ids = torch.frombuffer(joined, dtype=torch.int32).long()
        keep = ~torch.isin(torch.where(ids < 0, ~ids, ids), skip)
        ends = torch.tensor([len(item.input_ids) for item in items]).cumsum(0)
        kept_before = torch.cat([torch.zeros(1, dtype=torch.long), keep.long().cumsum(0)])
        counts = torch.diff(kept_before[ends], prepend=torch.zeros(1, dtype=torch.long))
        return list(torch.split(torch.cat(outputs)[keep], counts.tolist()))

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """Every token's vector, projected and normalized (float32, on the CPU), one ``[tokens, dimensions]``
        tensor per input. A complemented id is an expansion token: its true id, attention masked."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        ids = inputs["input_ids"]
        hidden = ids < 0
        inputs["input_ids"] = torch.where(hidden, ~ids, ids)
        inputs["attention_mask"] = inputs["attention_mask"].masked_fill(hidden, 0)
        passed = {name: value for name, value in inputs.items() if name in self._tokenizer.model_input_names}
        vectors = self._model(**passed).last_hidden_state
        for projection in self._projections:
            vectors = projection(vectors)
        vectors = vectors.float()
        if self.layout.dimensions is not None:
            vectors = vectors[..., : self.layout.dimensions]
        vectors = functional.normalize(vectors, p=2, dim=-1).cpu()
        return [vectors[row, : len(item.input_ids)] for row, item in enumerate(batch)]


def maxsim(query: torch.Tensor, documents: Sequence[torch.Tensor], *, mean: bool = False) -> torch.Tensor:
    """MaxSim of one query's vectors (``[q, d]``) with each document's (``[t_i, d]``): the sum over the query's
    vectors of the best dot product with any of the document's (over the query's count with ``mean``:
    sentence-transformers' meanmaxsim). Documents of like lengths run together, a block at a time, padding
    masked out of every max; a document with no vectors scores :data:`EMPTY_DOCUMENT_SCORE`."""
    scores = torch.empty(len(documents))
    order = sorted(range(len(documents)), key=lambda i: len(documents[i]))
    per_token = len(query) + (query.shape[1] if query.dim() == 2 else 0)  # a similarity row and a vector
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(documents[order[end]]) * per_token <= BLOCK_VALUES:
            end += 1
        block = order[start:end]
        lengths = torch.tensor([len(documents[i]) for i in block])
        padded = pad_sequence([documents[i] for i in block], batch_first=True)
        if padded.shape[1] == 0:
            scores[block] = EMPTY_DOCUMENT_SCORE
        else:
            sims = padded @ query.T  # [documents, tokens, query tokens]
            real = torch.arange(padded.shape[1]) < lengths[:, None]
            sims.masked_fill_(~real[:, :, None], float("-inf"))
            best = sims.amax(dim=1).sum(dim=1)
            scores[block] = torch.where(lengths == 0, EMPTY_DOCUMENT_SCORE, best)
        start = end
    return scores / len(query) if mean and len(query) else scores


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A document's text as its role tokenizes it, and where the text as sent starts in it (after the prompt,
    less the whitespace a strip removed)."""

    text: str
    start: int
    length: int

    @classmethod
    def of(cls, recipe: Role, given: str) -> _Prepared:
        full = recipe.prompt + given
        removed = len(full) - len(full.lstrip()) if recipe.strip else 0
        return cls(recipe.text(given), len(recipe.prompt) - removed, len(given))

    def span(self, body: _Tokens, low: int, high: int) -> tuple[int, int]:
        """Window ``[low, high)`` of the body's tokens as characters of the document as sent."""
        if high <= low:
            return (0, 0)
        start = min(max(body.starts[low] - self.start, 0), self.length)
        return (start, min(max(body.ends[high - 1] - self.start, start), self.length))


@dataclass(frozen=True, slots=True)
class _Tokens:
    """A document's tokens after its prompt's ``lead`` ones."""

    whole: Tokens
    lead: int

    @property
    def count(self) -> int:
        return self.whole.count - self.lead

    @property
    def ids(self) -> array[int]:
        return self.whole.ids[self.lead :]

    @property
    def starts(self) -> array[int]:
        return self.whole.starts[self.lead :]

    @property
    def ends(self) -> array[int]:
        return self.whole.ends[self.lead :]


def _ids(skip: frozenset[int]) -> torch.Tensor | None:
    return torch.tensor(sorted(skip), dtype=torch.long) if skip else None


def _own_length(tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> int:
    """The longest input the transformer takes: its positions and its tokenizer's limit (a PyLate folder's saved
    max_seq_length is whatever its last encode set, so it is not read)."""
    lengths = [int(tokenizer.model_max_length)]
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        lengths.append(positions)
    return min(lengths)
