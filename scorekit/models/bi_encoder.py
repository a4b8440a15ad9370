"""Bi-encoder: sentence-transformers embeddings (transformer, pooling, normalisation), served as they are
(/v1/embeddings, /embed) and as the cosine of two of them (/score, /rerank)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch.nn import functional
from transformers import AutoModel

from scorekit.errors import Place
from scorekit.tasks import Chunking, Embeddings, EmbedOptions, PairOptions, PairScores, Prompt, Window

from .base import (
    Checkpoint,
    Encoded,
    Encoding,
    ModelKind,
    Plan,
    SharedPrefix,
    TruncationSide,
    inference,
    located,
    no_checkpoint,
)
from .embed_options import Matryoshka, SavedPrompts, prompt_length
from .files import Source
from .loaded import LoadedModel
from .padding import pad_batch
from .pairs import Pairing, check_pair_options, distinct_sides, window_usage
from .pooling import pool, pools_prompt, read_pooling
from .runtime import TORCH, ModelRuntime
from .tokens import Meter
from .truncation import cut_texts, encode_text_windows, encode_texts, limits

# The prompts a pair's two sides get, as sentence-transformers' encode_query and encode_document pick them: the
# model's saved "query" and "document" prompts, or none.
QUERY = Prompt("query", if_saved=True)
DOCUMENT = Prompt("document", if_saved=True)


class BiEncoderBackend(LoadedModel):
    """An ``AutoModel`` plus the folder's pooling config; each text gets one pooled vector, normalised when
    the folder's modules say so (``normalizes``) or the request asks, and always for a cosine. An embedding
    request may put one of the model's saved prompts before its texts and cut its vectors (Matryoshka)."""

    chunks_documents = True  # scores a long document by its best window's cosine (tasks.Chunking)
    kind: ModelKind = "bi-encoder"
    batch_cost_follows_tokens = True

    def __init__(
        self, root: Source, *, device: torch.device, dtype: torch.dtype, runtime: ModelRuntime = TORCH
    ) -> None:
        name = root.name
        transformer_path, pooling_path, self.normalizes = _read_modules(name)
        source = Source(name, transformer_path, root.trust_remote_code)
        pooling_source = Source(name, pooling_path) if pooling_path is not None else None
        self.pooling = read_pooling(pooling_source, name)
        self.pools_prompt = pools_prompt(pooling_source)
        self.prompts = SavedPrompts.read(Source(name))
        # Where the pooling was read, for the start-up log.
        self.pooling_from = (
            "no Pooling module: mean, as sentence-transformers pools a plain encoder"
            if pooling_path is None
            else f"{pooling_path}/config.json".lstrip("/")
        )
        model = self.load(AutoModel, source, device, dtype)
        self.matryoshka = Matryoshka.of(model.config)
        self._forward = runtime.forward(model, "last_hidden_state", self._tokenizer.model_input_names)
        self._model = model if runtime.runs_the_module else None

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct text is embedded once (a 1:N request's query once); a pair's score is the cosine of
        its two normalised embeddings, the query embedded as sentence-transformers' ``encode_query`` embeds it
        and the document as ``encode_document`` does: after the model's saved "query" or "document" prompt (none
        unless saved; never the default prompt). ``use_activation`` means nothing here. With chunking, see
        :meth:`_plan_windowed`."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)
        if options.chunking is not None:
            return self._plan_windowed(side1, side2, options, options.chunking)
        pairing = Pairing.of(side1, side2)
        query_side = (options.query_tokens, self.prompts.text(QUERY))
        document_side = (options.document_tokens, self.prompts.text(DOCUMENT))
        # A row is a text, the cut its side asks for and its side's prompt: each distinct one is embedded once.
        rows = list(dict.fromkeys([(text, *query_side) for text in side1] + [(text, *document_side) for text in side2]))
        row_of = {row: i for i, row in enumerate(rows)}

        def finish(inputs: list[Encoded], outputs: list[torch.Tensor]) -> PairScores:
            embeddings = _finish(outputs, normalize=True)
            documents = [row_of[b, *document_side] for _, b in pairing.distinct]
            # One dot product per row, each summed in the same order: a pair's score never depends on its row.
            # The products overwrite rows that are not needed after: no other N-row tensor beside the embeddings.
            if len(side1) == 1:  # 1:N: every row times the query's one row (a copy, as its row is overwritten)
                query = embeddings[row_of[side1[0], *query_side]].clone()
                products = embeddings.mul_(query).sum(-1)[documents]
            else:
                queries = embeddings[[row_of[a, *query_side] for a, _ in pairing.distinct]]
                products = embeddings[documents].mul_(queries).sum(-1)
            scores: list[float] = products.tolist()
            # The query once per side-1 entry, as vLLM counts.
            tokens = sum(inputs[row_of[text, *query_side]].cost for text in side1)
            tokens += sum(inputs[row_of[text, *document_side]].cost for text in side2)
            return PairScores(pairing.spread(scores), tokens)

        def places_of(row: int, part: int | None) -> tuple[Place, ...]:
            text, *side = rows[row]
            in_side1 = text in side1 and tuple(side) == query_side
            return ((0, side1.index(text)),) if in_side1 else ((1, side2.index(text)),)

        def encode(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            texts = [text for text, _, _ in rows]
            for cut in {cut for _, cut, _ in rows} - {0}:
                places = [i for i, (_, tokens, _) in enumerate(rows) if tokens == cut]
                shorter = cut_texts(self._tokens, [texts[i] for i in places], cut, meter)
                for place, text in zip(places, shorter, strict=True):
                    texts[place] = text
            with located(places_of):
                encoded = self._encode_texts(
                    [prompt + text for text, (_, _, prompt) in zip(texts, rows, strict=True)],
                    options.truncate,
                    options.side,
                    meter,
                )
            meter.close()
            encoded = [self._skip_prompt(item, prompt) for item, (_, _, prompt) in zip(encoded, rows, strict=True)]
            return Encoding(encoded, lambda outputs: finish(encoded, outputs))

        return Plan(count=len(rows), chars=sum(len(text) + len(prompt) for text, _, prompt in rows), encode=encode)

    def _skip_prompt(self, item: Encoded, prompt: str) -> Encoded:
        """``item``, marked to leave ``prompt``'s tokens out of pooling when the Pooling module says so
        (``include_prompt: false``; see ``forward``)."""
        if not prompt or self.pools_prompt:
            return item
        return replace(item, prefix=SharedPrefix(prompt_length(self._tokenizer, prompt)))

    def _plan_windowed(
        self, side1: list[str], side2: list[str], options: PairOptions, chunking: Chunking
    ) -> Plan[PairScores]:
        """A long document scored by windows, by the cross-encoder's rule: each distinct query is embedded once
        (checked or cut as without chunking), each distinct document as windows of its tokens that each fit the
        model, every window an input of its own; a pair's score is the best cosine of its query with its
        document's windows (the first of equal ones), and which window won. Usage counts the query once per
        side-1 entry and every window of a document once per side-2 entry, as vLLM counts every pair."""
        pairing = Pairing.of(side1, side2)
        query_prompt, document_prompt = self.prompts.text(QUERY), self.prompts.text(DOCUMENT)
        queries, documents, query_row, document_row = distinct_sides(side1, side2)

        def encode(checkpoint: Checkpoint) -> Encoding[PairScores]:
            meter = Meter(checkpoint)
            asked = [query_prompt + text for text in cut_texts(self._tokens, queries, options.query_tokens, meter)]
            with located(lambda row, _: ((0, side1.index(queries[row])),)):
                query_inputs = self._encode_texts(asked, options.truncate, options.side, meter)
            read = cut_texts(self._tokens, documents, options.document_tokens, meter)
            window_inputs, spans = encode_text_windows(
                self._tokens, read, self.max_length, chunking, meter, document_prompt
            )
            meter.close()
            query_inputs = [self._skip_prompt(item, query_prompt) for item in query_inputs]
            window_inputs = [self._skip_prompt(item, document_prompt) for item in window_inputs]
            inputs = query_inputs + window_inputs
            return Encoding(inputs, lambda outputs: finish(inputs, spans, outputs))

        def finish(
            inputs: list[Encoded], spans: list[list[tuple[int, int]]], outputs: list[torch.Tensor]
        ) -> PairScores:
            embeddings = _finish(outputs, normalize=True)
            # Where each distinct document's windows start among the inputs (the queries' come first).
            starts = list(itertools.accumulate((len(ranges) for ranges in spans), initial=len(queries)))
            scores, which = [], []
            for query, document in pairing.distinct:
                row = document_row[document]
                cosines = embeddings[starts[row] : starts[row + 1]] @ embeddings[query_row[query]]
                best = int(torch.argmax(cosines))  # the first of equal maxima
                scores.append(float(cosines[best]))
                which.append(Window(best, len(spans[row]), *spans[row][best]))
            tokens = window_usage(inputs, side1, side2, query_row, document_row, starts)
            return PairScores(pairing.spread(scores), tokens, pairing.spread(which))

        return Plan(count=len(queries) + len(documents), chars=sum(map(len, queries + documents)), encode=encode)

    def plan_embed(self, texts: list[str], options: EmbedOptions) -> Plan[Embeddings]:
        """Each distinct text is run once; usage counts every input's tokens, repeats included (as vLLM), the
        prompt's too. The prompt goes before each text as sentence-transformers' ``encode(prompt_name=...)``
        puts it; ``dimensions`` cuts the pooled vector before it is normalized (``truncate_dim``, then
        ``normalize_embeddings``). Both are checked here, before any tokenizing."""
        distinct = list(dict.fromkeys(texts))
        row_of = {text: i for i, text in enumerate(distinct)}
        normalize = self.normalizes if options.normalize is None else options.normalize
        size = None if options.dimensions is None else self.matryoshka.check(options.dimensions)
        prompt = self.prompts.text(options.prompt)

        def finish(inputs: list[Encoded], outputs: list[torch.Tensor]) -> Embeddings:
            rows: list[list[float]] = _finish(outputs, normalize=normalize, size=size).tolist()
            tokens = sum(inputs[row_of[text]].cost for text in texts)
            return Embeddings([rows[row_of[text]] for text in texts], tokens)

        def encode(checkpoint: Checkpoint) -> Encoding[Embeddings]:
            prompted = [prompt + text for text in distinct]
            with located(lambda row, _: ((1, texts.index(distinct[row])),)):
                encoded = self.encode_texts(prompted, options.truncate, options.side, checkpoint)
            encoded = [self._skip_prompt(item, prompt) for item in encoded]
            return Encoding(encoded, lambda outputs: finish(encoded, outputs))

        chars = sum(map(len, distinct)) + len(prompt) * len(distinct)
        return Plan(count=len(distinct), chars=chars, encode=encode)

    def encode_texts(
        self,
        texts: Sequence[str],
        truncate: int | None,
        side: TruncationSide | None,
        checkpoint: Checkpoint = no_checkpoint,
    ) -> list[Encoded]:
        """Each text on its own, with the tokenizer's special tokens."""
        meter = Meter(checkpoint)
        encoded = self._encode_texts(texts, truncate, side, meter)
        meter.close()
        return encoded

    def _encode_texts(
        self, texts: Sequence[str], truncate: int | None, side: TruncationSide | None, meter: Meter
    ) -> list[Encoded]:
        request_limits = limits(self._tokens, truncate, side, self.max_length)
        return encode_texts(self._tokens, texts, request_limits, meter)

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """One pooled float32 vector per text, on the CPU, not yet normalised (plans decide, see ``_finish``)."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        hidden = self._forward(inputs).float()
        pooled = pool(self.pooling, hidden, _pooled_mask(inputs["attention_mask"], batch)).cpu()
        return list(pooled.unbind())


def _pooled_mask(mask: torch.Tensor, batch: Sequence[Encoded]) -> torch.Tensor:
    """The tokens pooling reads: the attention mask, less the leading tokens of a prompt that sentence-transformers'
    Pooling leaves out (``include_prompt: false``; only such inputs carry them, as their ``prefix``)."""
    skip = [item.prefix.length if item.prefix is not None else 0 for item in batch]
    if not any(skip):
        return mask
    places = torch.arange(mask.shape[1], device=mask.device)
    return mask * (places >= torch.tensor(skip, device=mask.device)[:, None])


def _finish(outputs: list[torch.Tensor], *, normalize: bool, size: int | None = None) -> torch.Tensor:
    """The embeddings, one row per output, each cut to its first ``size`` values when asked (Matryoshka), then
    normalized as sentence-transformers' Normalize module does, when asked (in place: a request's rows are
    stacked once, not copied again)."""
    pooled = torch.stack(outputs if size is None else [output[:size] for output in outputs])
    return functional.normalize(pooled, p=2, dim=1, out=pooled) if normalize else pooled


def _read_modules(name: str) -> tuple[str, str | None, bool]:
    """The transformer's and the pooling module's folders from modules.json, and whether it ends with a
    Normalize module (a plain folder: root, none, no: what sentence-transformers makes of one)."""
    modules: Any = Source(name).read_json("modules.json")
    transformer, pooling, normalizes = "", None, False
    for module in modules or []:
        module_type = str(module.get("type", "")).rsplit(".", 1)[-1]
        if module_type == "Transformer":
            transformer = str(module.get("path", ""))
        elif module_type == "Pooling":
            pooling = str(module.get("path", ""))
        elif module_type == "Normalize":
            normalizes = True
        else:
            raise ValueError(f"Model {name!r} has a {module_type} module, which the bi-encoder cannot run.")
    return transformer, pooling, normalizes
