"""A listwise reranker (jina-reranker-v3): one context reads the query and up to 64 documents, and each document's
score is the cosine between projected hidden states at its marker token and at the query's.

The recipe is the published one (the modeling code of jinaai/jina-reranker-v3): the prompt :func:`listwise_prompt`
writes, tokenized whole; the backbone's last hidden states (after its final norm) at each ``<|embed_token|>`` (one
after each document) and at the ``<|rerank_token|>`` (after the query, at the prompt's end); a projector of two
bias-free linear layers around a ReLU; then the cosine. scorekit runs the backbone with transformers' own Qwen3
classes and reads the projector's two weights from the checkpoint, so the checkpoint's code never runs and no
``--trust-remote-code`` is asked.

**Scores depend on the other documents.** The documents share one context and attention is causal, so a
document's hidden state reads the query line and every document before it, and the query's marker reads them all:
the same (query, document) pair scores differently beside other documents, or in another order. Documents past the
64th, or past what fits in the model's length, go to further windows, each a prompt of its own with the same query;
their scores are joined as the recipe joins them: the query's projected embedding is averaged over the windows,
each weighted by its best (1 + cosine) / 2, and every document is scored against that average. A request's windows
are ordinary model inputs: they batch with other requests', and a cancelled request's unrun windows are dropped.
Each distinct document of a request is read once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from safetensors import safe_open
from transformers import AutoModel, PreTrainedTokenizerBase
from transformers.utils.hub import cached_file

from scorekit.errors import InputTooLong, NoRoomForDocument
from scorekit.tasks import PairOptions, PairScores

from .base import (
    Checkpoint,
    Encoded,
    Encoding,
    Limits,
    ModelKind,
    Plan,
    TruncationSide,
    inference,
    located,
    token_array,
)
from .files import Source, loading
from .loaded import LoadedModel
from .padding import padded
from .pairs import Pairing, check_pair_options
from .tokens import Meter, Tokens
from .truncation import cut_texts, limits

ARCHITECTURE = "JinaForRanking"  # config.json's architectures name for a listwise reranker
EMBED_TOKEN = "<|embed_token|>"  # after each document: where its embedding is read
QUERY_TOKEN = "<|rerank_token|>"  # after the query at the prompt's end: where the query's embedding is read
WINDOW_DOCUMENTS = 64  # the most documents one context reads
PROJECTOR_WEIGHTS = ("projector.0.weight", "projector.2.weight")
_SYSTEM = (
    "<|im_start|>system\n"
    "You are a search relevance expert who can determine a ranking of the passages based on how relevant they are "
    "to the query. If the query is a question, how relevant a passage is depends on how well it answers the "
    "question. If not, try to analyze the intent of the query and assess how well each passage satisfies the "
    "intent. If an instruction is provided, you should follow the instruction when determining the ranking."
    "<|im_end|>\n<|im_start|>user\n"
)
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def listwise_prompt(query: str, documents: Sequence[str], instruction: str | None) -> str:
    """The published prompt: the system line, the query, the instruction if any, each document as a numbered
    passage closed by its marker, then the query again closed by its marker (texts already :func:`sanitized`)."""
    passages = "\n".join(
        f'<passage id="{i}">\n{document}{EMBED_TOKEN}\n</passage>' for i, document in enumerate(documents)
    )
    body = (
        f"I will provide you with {len(documents)} passages, each indicated by a numerical identifier. "
        f"Rank the passages based on their relevance to query: {query}\n"
    )
    if instruction:
        body += f"<instruct>\n{instruction}\n</instruct>\n"
    return f"{_SYSTEM}{body}{passages}\n<query>\n{query}{QUERY_TOKEN}\n</query>{_SUFFIX}"


def sanitized(text: str) -> str:
    """``text`` with no marker left in it, so no input can add or move a place where embeddings are read. The
    recipe removes each marker once, in turn, which a marker hidden inside another survives; this repeats until
    none is left."""
    while EMBED_TOKEN in text or QUERY_TOKEN in text:
        text = text.replace(EMBED_TOKEN, "").replace(QUERY_TOKEN, "")
    return text


@dataclass(frozen=True, slots=True)
class _Window:
    """One prompt: the query group it reads (its place in the plan's groups), the distinct pairs' rows whose
    documents it holds, in prompt order, and its tokens."""

    group: int
    rows: list[int]
    encoded: Encoded


@dataclass(frozen=True, slots=True)
class _Passage:
    """A document as a window holds it: its distinct pair's row, its text, and whether that was cut to fit."""

    row: int
    document: str
    cut: bool = False


@dataclass(frozen=True, slots=True)
class _Context:
    """What every window of one query shares: its group, query and instruction, its length, and the side a
    cut document keeps."""

    group: int
    query: str
    instruction: str | None
    room: int
    side: TruncationSide


@dataclass(frozen=True, slots=True)
class _Sizes:
    """Token counts of the prompt's fixed parts, measured once with the model's tokenizer: the prompt with an
    empty query and no document, and the most a passage's wrapping adds beside its document's tokens."""

    fixed: int
    per_document: int


class ListwiseRerankerBackend(LoadedModel):
    """A Qwen3 backbone and a projector, reading a query and its documents in one context (module docstring)."""

    chunks_documents = False  # a document is one passage of a shared context; it is cut, not windowed
    kind: ModelKind = "listwise-reranker"
    batch_cost_follows_tokens = True  # a window is one sequence, whose cost its tokens say

    def __init__(self, source: Source, *, device: torch.device, dtype: torch.dtype) -> None:
        own = Source(source.name, source.subfolder)  # transformers' Qwen3 classes: the checkpoint's code never runs
        self._model = self.load(AutoModel, own, device, dtype, joins=False)  # the prompt is tokenized whole
        self._markers = (
            _marker(self._tokenizer, EMBED_TOKEN, self.name),
            _marker(self._tokenizer, QUERY_TOKEN, self.name),
        )
        hidden = self._model.config.get_text_config().hidden_size
        self._projector = _projector(own, hidden, device, dtype)
        self._sizes = self._measure()

    def _measure(self) -> _Sizes:
        """The fixed part, and a passage's wrapping counted at the widest numbering a window uses (its last id)."""
        fixed = self._count(listwise_prompt("", [], None))
        full = self._count(listwise_prompt("", [""] * WINDOW_DOCUMENTS, None))
        return _Sizes(fixed, -(-(full - fixed) // WINDOW_DOCUMENTS) + 1)

    def _count(self, text: str) -> int:
        return len(self._tokenizer.backend_tokenizer.encode(text).ids)

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct query's distinct documents in windows of at most 64 that fit; scores as the module says."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)
        pairing = Pairing.of(side1, side2)
        groups: dict[str, list[int]] = {}
        for row, (query, _) in enumerate(pairing.distinct):
            groups.setdefault(query, []).append(row)
        rows_of = list(groups.values())

        def run(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            request_limits = limits(self._tokens, options.truncate, options.side, self.max_length)
            with located(pairing.places):
                windows = [
                    window
                    for group, rows in enumerate(rows_of)
                    for window in self._windows(group, rows, pairing, options, request_limits, meter)
                ]
            meter.close()

            def finish(outputs: list[torch.Tensor]) -> PairScores:
                scores = [0.0] * len(pairing.distinct)
                for group in range(len(rows_of)):
                    mine = [
                        (window, output)
                        for window, output in zip(windows, outputs, strict=True)
                        if window.group == group
                    ]
                    for row, score in joined_scores(mine):
                        scores[row] = score
                return PairScores(pairing.spread(scores), sum(window.encoded.cost for window in windows))

            return Encoding([window.encoded for window in windows], finish)

        windows = sum(-(-len(rows) // WINDOW_DOCUMENTS) for rows in rows_of)  # at least; more when lengths split them
        return Plan(windows, sum(len(a) + len(b) for a, b in pairing.distinct), run)

    def _windows(
        self,
        group: int,
        rows: list[int],
        pairing: Pairing,
        options: PairOptions,
        request_limits: Limits,
        meter: Meter,
    ) -> list[_Window]:
        """One query's documents packed in order into windows of at most 64 whose prompts fit the request's
        length (its truncation, else the model's); a document too long for a window of its own is cut to fit
        when the request truncates, else refused."""
        room = request_limits.keep or request_limits.max_length
        [query] = cut_texts(self._tokens, [sanitized(pairing.distinct[rows[0]][0])], options.query_tokens, meter)
        documents = cut_texts(
            self._tokens, [sanitized(pairing.distinct[row][1]) for row in rows], options.document_tokens, meter
        )
        instruction = options.instruction
        [query_tokens, instruction_tokens] = self._tokens.content([query, instruction or ""], meter, cap=room)
        base = self._sizes.fixed + 2 * query_tokens.count + (instruction_tokens.count + 6 if instruction else 0)
        if base + self._sizes.per_document + 1 > room:
            raise NoRoomForDocument(rows[0], query_tokens.count if query_tokens.complete else None, None, room)
        side = request_limits.side
        packed: list[list[_Passage]] = [[]]
        used = base
        for row, document, found in zip(
            rows, documents, self._tokens.content(documents, meter, cap=room, side=side, offsets=True), strict=True
        ):
            cost = found.count + self._sizes.per_document
            passage = _Passage(row, document)
            if base + cost > room:
                if request_limits.keep is None:
                    raise InputTooLong(row, base + cost if found.complete else None, room, chars=len(document))
                keep = room - base - self._sizes.per_document
                passage, cost = _Passage(row, _cut(document, found, keep, side), True), keep + self._sizes.per_document
            if packed[-1] and (len(packed[-1]) == WINDOW_DOCUMENTS or used + cost > room):
                packed.append([])
                used = base
            packed[-1].append(passage)
            used += cost
        context = _Context(group, query, instruction, room, side)
        return [window for passages in packed for window in self._fitted(context, passages, meter)]

    def _fitted(self, context: _Context, passages: list[_Passage], meter: Meter) -> list[_Window]:
        """The window's prompt tokenized whole. Counted from its parts it fits, but tokens can merge or part
        across a passage's edges: a window that does not fit is split in two, and a lone passage that was cut
        is cut by the excess too (one that was not is refused)."""
        prompt = listwise_prompt(context.query, [passage.document for passage in passages], context.instruction)
        [encoding] = self._tokens.encodings([prompt], meter, special_tokens=True)
        ids = encoding.ids
        if len(ids) <= context.room:
            truncated = any(passage.cut for passage in passages)
            rows = [passage.row for passage in passages]
            return [_Window(context.group, rows, Encoded(token_array(ids), truncated=truncated))]
        if len(passages) > 1:
            half = len(passages) // 2
            return self._fitted(context, passages[:half], meter) + self._fitted(context, passages[half:], meter)
        [passage] = passages
        [found] = self._tokens.content([passage.document], meter, side=context.side, offsets=True)
        keep = found.count - (len(ids) - context.room)
        if not passage.cut or keep < 1:
            raise InputTooLong(passage.row, len(ids), context.room)
        return self._fitted(
            context, [_Passage(passage.row, _cut(passage.document, found, keep, context.side), True)], meter
        )

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """Per window, the projected embeddings at its document markers, then at its query marker: one float32
        CPU tensor of (documents + 1) rows each (an input without markers, such as a memory probe, gets none)."""
        if not batch:
            return []
        ids, real = padded([item.input_ids for item in batch], self._pad_id)  # right: causal attention never reads it
        hidden = self._model(input_ids=ids.to(self._device), attention_mask=real.to(self._device)).last_hidden_state
        embed, query = self._markers
        places = [
            torch.cat([(row == embed).nonzero().flatten(), (row == query).nonzero().flatten()[-1:]]) for row in ids
        ]
        rows = torch.cat([torch.full_like(found, index) for index, found in enumerate(places)])
        picked = self._projector(hidden[rows.to(self._device), torch.cat(places).to(self._device)]).float().cpu()
        return list(picked.split([len(found) for found in places]))


def joined_scores(windows: Sequence[tuple[_Window, torch.Tensor]]) -> list[tuple[int, float]]:
    """One query's scores from its windows' outputs: each document's cosine with the query's embedding averaged
    over the windows, each weighted by its best (1 + cosine) / 2 (one window: its own query embedding)."""
    documents = torch.cat([output[:-1] for _, output in windows]).double()
    queries = torch.stack([output[-1] for _, output in windows]).double()
    weights = torch.stack(
        [(1 + _cosines(output[:-1].double(), output[-1].double())).max() / 2 for _, output in windows]
    )
    merged = (
        (weights[:, None] * queries).sum(dim=0) / weights.sum() if float(weights.sum()) > 0 else queries.mean(dim=0)
    )
    rows = [row for window, _ in windows for row in window.rows]
    return list(zip(rows, _cosines(documents, merged).tolist(), strict=True))


def _cut(document: str, found: Tokens, keep: int, side: TruncationSide) -> str:
    """``document`` cut to ``keep`` of its tokens from ``side`` ("right" keeps its start), at token edges."""
    return document[: found.ends[keep - 1]] if side == "right" else document[found.starts[-keep] :]


def _cosines(vectors: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each row's cosine with ``target``."""
    cosines: torch.Tensor = (vectors @ target) / (vectors.norm(dim=-1) * target.norm()).clamp_min(1e-12)
    return cosines


def _marker(tokenizer: PreTrainedTokenizerBase, token: str, name: str) -> int:
    """The id of a marker token, which the tokenizer must hold as one token of its own."""
    found = tokenizer.convert_tokens_to_ids(token)
    if (
        not isinstance(found, int)
        or found == tokenizer.unk_token_id
        or tokenizer(token, add_special_tokens=False)["input_ids"] != [found]
    ):
        raise ValueError(f"Model {name!r} is a listwise reranker, but its tokenizer has no {token} token.")
    return found


def _projector(source: Source, hidden: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Sequential:
    """The projector the checkpoint saved beside its backbone (on the meta device: its shape, no weights)."""
    if device.type == "meta":
        first, second = torch.empty(hidden // 2, hidden, device=device), torch.empty(512, hidden // 2, device=device)
    else:
        first, second = _read_tensors(source, PROJECTOR_WEIGHTS)
    projector = torch.nn.Sequential(
        torch.nn.Linear(first.shape[1], first.shape[0], bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(second.shape[1], second.shape[0], bias=False),
    )
    if device.type != "meta":
        projector.load_state_dict({"0.weight": first, "2.weight": second})
    return projector.to(device=device, dtype=dtype).eval()


def _read_tensors(source: Source, keys: Sequence[str]) -> list[torch.Tensor]:
    """Tensors by name from the checkpoint's safetensors (one file, or shards listed by its index)."""
    index = source.read_json("model.safetensors.index.json")
    files = index.get("weight_map", {}) if isinstance(index, dict) else {}
    tensors = []
    for key in keys:
        with loading(source.name):
            path = cached_file(source.name, files.get(key, "model.safetensors"), **source.kwargs())
        names: list[str] = []
        if path is not None:
            with safe_open(path, framework="pt") as weights:
                names = list(weights.keys())
                if key in names:
                    tensors.append(weights.get_tensor(key))
        if key not in names:
            raise ValueError(f"Model {source.name!r} is a listwise reranker, but it has no {key} in its weights.")
    return tensors
