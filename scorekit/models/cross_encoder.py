"""Cross-encoder: one sequence-classification logit per (query, document) pair, as sentence-transformers runs it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AutoModelForSequenceClassification, PretrainedConfig

from scorekit.tasks import PairOptions, PairScores, ParamOf

from .base import Checkpoint, Encoded, ModelKind, Plan, TruncationSide, no_checkpoint
from .loading import (
    Source,
    check_pair_options,
    load_model,
    load_tokenizer,
    pad_batch,
    pad_token_id,
    read_max_length,
)
from .pairs import Pairing, sigmoid
from .runtime import TORCH, ModelRuntime
from .tokens import Meter, TextTokenizer, cut_texts, encode_pair_windows, encode_pairs, limits
from .windows import Layout

# Activation names a CrossEncoder may have saved in its config; sigmoid is its default for one label.
_IDENTITY = {"torch.nn.Identity", "torch.nn.modules.linear.Identity"}
_SIGMOID = {"torch.nn.Sigmoid", "torch.nn.modules.activation.Sigmoid"}


class CrossEncoderBackend:
    """A single-label ``AutoModelForSequenceClassification`` scoring text pairs."""

    chunks_documents = True  # scores a long document by its best window (tasks.Chunking)
    kind: ModelKind = "cross-encoder"

    def __init__(
        self, source: Source, *, device: torch.device, dtype: torch.dtype, runtime: ModelRuntime = TORCH
    ) -> None:
        name = source.name
        self._tokenizer = load_tokenizer(source)
        self._tokens = TextTokenizer(self._tokenizer)
        model = load_model(AutoModelForSequenceClassification, source, device, dtype, self.kind)
        if model.config.num_labels != 1:
            raise ValueError(
                f"Model {name!r} has {model.config.num_labels} labels; a cross-encoder needs exactly one "
                "(a single relevance logit)."
            )
        self._forward = runtime.forward(model, "logits", self._tokenizer.model_input_names)
        self._model = model if runtime.runs_the_module else None
        self._device = device
        self._pad_id = pad_token_id(self._tokenizer)
        self._sigmoid = _uses_sigmoid(model.config, name)
        self.name = name
        self.max_length = read_max_length(source, self._tokenizer, model.config)
        self.vocab_size: int = model.config.get_text_config().vocab_size

    def plan_pairs(
        self, side1: list[str], side2: list[str], options: PairOptions, param_of: ParamOf
    ) -> Plan[PairScores]:
        """Each distinct pair runs once; its score is the activation of its logit (or the raw logit)."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)
        pairing = Pairing.of(side1, side2)
        firsts, seconds = [a for a, _ in pairing.distinct], [b for _, b in pairing.distinct]

        layout = Layout()

        def encode(checkpoint: Checkpoint) -> list[Encoded]:
            meter = Meter(checkpoint)
            queries = cut_texts(self._tokens, firsts, options.query_tokens, meter)
            documents = cut_texts(self._tokens, seconds, options.document_tokens, meter)
            if options.chunking is None:
                layout.spans.extend([(0, len(document))] for document in seconds)
                encoded = self._encode_pairs(queries, documents, options.truncate, options.side, meter)
            else:
                encoded, spans = encode_pair_windows(
                    self._tokens, queries, documents, self.max_length, options.chunking, meter
                )
                layout.spans.extend(spans)
            meter.close()
            return encoded

        def finish(inputs: list[Encoded], outputs: list[torch.Tensor]) -> PairScores:
            activation = None if options.use_activation is False else self.activation
            logits = [float(output) for output in outputs]
            return layout.finish(pairing, inputs, logits, activation, chunked=options.chunking is not None)

        return Plan(
            count=len(firsts),
            chars=sum(map(len, firsts)) + sum(map(len, seconds)),
            encode=encode,
            finish=finish,
            param_of=lambda row, part: pairing.name(row, param_of, one_query=len(side1) == 1, part=part),
        )

    def encode_pairs(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        truncate: int | None,
        side: TruncationSide | None,
        checkpoint: Checkpoint = no_checkpoint,
    ) -> list[Encoded]:
        """Pair i is (queries[i], documents[i]), tokenized as one sequence with token type ids."""
        meter = Meter(checkpoint)
        encoded = self._encode_pairs(queries, documents, truncate, side, meter)
        meter.close()
        return encoded

    def _encode_pairs(
        self,
        queries: Sequence[str],
        documents: Sequence[str],
        truncate: int | None,
        side: TruncationSide | None,
        meter: Meter,
    ) -> list[Encoded]:
        request_limits = limits(self._tokens, truncate, side, self.max_length)
        return encode_pairs(self._tokens, queries, documents, request_limits, meter)

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """The raw logit of each pair, as a 0-d float32 CPU tensor."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        with torch.inference_mode():
            logits = self._forward(inputs)[:, 0].float().cpu()
        return list(logits.unbind())

    def activation(self, logit: float) -> float:
        """What sentence-transformers' CrossEncoder.predict applies to the logit (sigmoid unless saved otherwise)."""
        return sigmoid(logit) if self._sigmoid else logit


def _uses_sigmoid(config: PretrainedConfig, name: str) -> bool:
    """Read the activation a CrossEncoder saved (new and pre-v4 keys); without one, sigmoid."""
    saved = getattr(config, "sentence_transformers", None)
    path = saved.get("activation_fn") if isinstance(saved, dict) else None
    path = path or getattr(config, "sbert_ce_default_activation_function", None)
    if path is None or path in _SIGMOID:
        return True
    if path in _IDENTITY:
        return False
    raise ValueError(f"Model {name!r} asks for the activation {path!r}; scorekit supports Sigmoid and Identity.")
