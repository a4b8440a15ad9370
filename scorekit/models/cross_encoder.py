"""Cross-encoder: one sequence-classification logit per (query, document) pair, as sentence-transformers runs it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from scorekit.tasks import PairOptions, PairScores

from .activations import saved_activation
from .base import Checkpoint, Encoded, ModelKind, Plan, TruncationSide, inference, no_checkpoint
from .files import Source
from .loaded import LoadedModel
from .padding import pad_batch
from .pairs import check_pair_options
from .runtime import TORCH, ModelRuntime
from .st_head import ModularCrossEncoder, modular_transformer, read_head
from .tokens import Meter
from .truncation import cut_texts, encode_pair_windows, encode_pairs, limits
from .windows import Spans, plan_windowed_pairs


class CrossEncoderBackend(LoadedModel):
    """A single-label ``AutoModelForSequenceClassification`` scoring text pairs, or sentence-transformers'
    modular CrossEncoder: a backbone and the head modules after it (``st_head``)."""

    chunks_documents = True  # scores a long document by its best window (tasks.Chunking)
    kind: ModelKind = "cross-encoder"
    batch_cost_follows_tokens = True

    def __init__(
        self, source: Source, *, device: torch.device, dtype: torch.dtype, runtime: ModelRuntime = TORCH
    ) -> None:
        modular = modular_transformer(source)
        model: torch.nn.Module
        if modular is None:
            classifier = self.load(AutoModelForSequenceClassification, source, device, dtype)
            if classifier.config.num_labels != 1:
                raise ValueError(
                    f"Model {self.name!r} has {classifier.config.num_labels} labels; a cross-encoder needs exactly"
                    " one (a single relevance logit)."
                )
            model, config = classifier, classifier.config
        else:  # sentence-transformers' modular CrossEncoder: a backbone, then its head modules
            if runtime.name != "torch":
                raise ValueError(
                    f"Model {source.name!r} is a CrossEncoder with a head of modules, which --runtime {runtime.name}"
                    " cannot run yet: serve it with --runtime torch."
                )
            transformer, modules = modular
            backbone = self.load(AutoModel, Source(source.name, transformer, source.trust_remote_code), device, dtype)
            head = read_head(source, modules, device, dtype)
            model, config = (
                ModularCrossEncoder(backbone, head, tuple(self._tokenizer.model_input_names)),
                backbone.config,
            )
        self._forward = runtime.forward(model, "logits", self._tokenizer.model_input_names)  # type: ignore[arg-type]
        self._model = model if runtime.runs_the_module else None
        # What sentence-transformers' CrossEncoder.predict applies to the logit, read where it saved it.
        self.activation = saved_activation(
            config,
            source.read_json("config_sentence_transformers.json"),
            self.name,
            trust_remote_code=source.trust_remote_code,
        )

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct pair runs once; its score is the activation of its logit (or the raw logit)."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)

        def encode(firsts: list[str], seconds: list[str], meter: Meter) -> tuple[list[Encoded], Spans]:
            queries = cut_texts(self._tokens, firsts, options.query_tokens, meter)
            documents = cut_texts(self._tokens, seconds, options.document_tokens, meter)
            if options.chunking is None:
                encoded = self._encode_pairs(queries, documents, options.truncate, options.side, meter)
                return encoded, [[(0, len(document))] for document in seconds]
            return encode_pair_windows(self._tokens, queries, documents, self.max_length, options.chunking, meter)

        return plan_windowed_pairs(side1, side2, options, encode, float, self.activation)

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

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """The raw logit of each pair, as a 0-d float32 CPU tensor."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        logits = self._forward(inputs)[:, 0].float().cpu()
        return list(logits.unbind())
