"""What the backends share: finding a model's files, loading it, its length limit, truncation and padding."""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Encoding
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging
from transformers.utils.hub import cached_file

from scorekit.choices import DTYPES, device_error
from scorekit.errors import InputTooLong, InvalidRequest, TruncationTooLarge
from scorekit.tasks import Chunking, PairOptions

from .base import Checkpoint, Encoded, Limits, ModelKind, TruncationSide, token_array
from .windows import token_windows

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Tokenizers without a limit report a sentinel near 1e30 as model_max_length.
_NO_LIMIT = 10**12
# Tokenizing about this many characters takes a few tens of milliseconds: the most an abandoned request
# tokenizes after its client left (one text longer than this is still one call).
TOKENIZE_CHUNK_CHARS = 1 << 16
PAIRS_PER_CHECKPOINT = 256
# Without truncation, an input of more characters than this many per token of the model's maximum length
# cannot fit (as vLLM's VLLM_MAX_CHARS_PER_TOKEN pre-check): refused before any tokenizing. Real text runs
# 3-6 characters per token; only long runs of whitespace or of unknown characters pack more.
MAX_CHARS_PER_TOKEN = 64


@dataclass(frozen=True, slots=True)
class Source:
    """Where a model's files live: a local folder is read offline, anything else is a hub name."""

    name: str
    subfolder: str = ""
    trust_remote_code: bool = False  # run the model's own Python code (its config names it), as transformers asks

    @property
    def is_local(self) -> bool:
        return Path(self.name).is_dir()

    def kwargs(self) -> dict[str, Any]:
        """The location arguments every ``from_pretrained`` call takes."""
        return {"local_files_only": self.is_local, "subfolder": self.subfolder}

    def pretrained_kwargs(self) -> dict[str, Any]:
        """What every ``from_pretrained`` call takes: the location, and whether the model's own code may run."""
        return {**self.kwargs(), "trust_remote_code": self.trust_remote_code}

    def read_json(self, filename: str) -> Any:
        """A JSON file of the model, or None when it has no such file (or it cannot be fetched)."""
        with loading(self.name):
            path = cached_file(
                self.name,
                filename,
                **self.kwargs(),
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
            )
            return None if path is None else json.loads(Path(path).read_text(encoding="utf-8"))


@contextmanager
def loading(name: str) -> Iterator[None]:
    """Turn any loader failure into one error that names only what the user gave (no paths, no traceback)."""
    try:
        yield
    except Exception as exc:
        raise ValueError(
            f"Model {name!r} could not be loaded ({type(exc).__name__}). Give a local model folder, "
            "or the name of a model that is in the local Hugging Face cache."
        ) from exc


def parse_device(device: str) -> torch.device:
    """Check the device at load time, so a bad one is a clear error instead of a failed first batch."""
    if (error := device_error(device)) is not None:
        raise ValueError(error[0].upper() + error[1:] + ".")
    parsed = torch.device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"Device {device!r} was asked for, but CUDA is not available.")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"Device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s).")
    return parsed


def parse_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is float32 on the CPU (exact scores) and float16 on CUDA (speed)."""
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"Unsupported dtype {dtype!r}: use {', '.join(map(repr, DTYPES))}.")
    return _DTYPES[dtype]


def load_tokenizer(source: Source) -> PreTrainedTokenizerBase:
    """A fast tokenizer with its own truncation and padding switched off.

    The Rust tokenizer keeps truncation and padding as mutable state, and changing it while another thread
    encodes raises "Already borrowed". Clearing it once here means our calls (which never ask the tokenizer
    to truncate or pad) never change it, so any thread may tokenize at any time.
    """
    with loading(source.name):
        tokenizer = AutoTokenizer.from_pretrained(source.name, **source.pretrained_kwargs())
    if not tokenizer.is_fast:
        raise ValueError(f"Model {source.name!r} has no fast tokenizer (tokenizer.json), which scorekit needs.")
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.backend_tokenizer.no_padding()
    return cast(PreTrainedTokenizerBase, tokenizer)


def kind_of(architectures: Sequence[str]) -> ModelKind:
    """The kind a config's ``architectures`` name; a plain encoder (or none named) is a bi-encoder."""
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return "cross-encoder"
    if any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        return "causal-lm"
    return "bi-encoder"


def load_model(
    auto_class: Any, source: Source, device: torch.device, dtype: torch.dtype, kind: ModelKind
) -> PreTrainedModel:
    """Load the weights in ``dtype``, move them to ``device``, and switch to eval mode.

    Refuses a model that transformers had to complete with random weights (a cross-encoder folder loaded as a
    causal LM gets a random LM head): it would serve scores that mean nothing, with no error anywhere.
    """
    with loading(source.name), _no_progress_bars():
        loaded = auto_class.from_pretrained(
            source.name, dtype=dtype, output_loading_info=True, **source.pretrained_kwargs()
        )
    model: PreTrainedModel = loaded[0]
    info: dict[str, Any] = loaded[1]
    _check_trained(model, info["missing_keys"], source.name, kind)
    # transformers' stubs lose the binding of its decorated ``to`` and leave ``eval`` untyped.
    model.to(device)  # type: ignore[arg-type]
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _check_trained(model: PreTrainedModel, missing: Iterable[str], name: str, kind: ModelKind) -> None:
    """Refuse ``missing`` weights, except a pooler's for a bi-encoder (its pooling is sentence-transformers')."""
    random = sorted(key for key in missing if not (kind == "bi-encoder" and ".pooler." in f".{key}"))
    if not random:
        return
    architectures = list(getattr(model.config, "architectures", None) or [])
    detected = kind_of(architectures)
    named = ", ".join(architectures) or "no architecture"
    why = (
        f"its config.json names {named}, which is a {detected}: leave the model kind out to detect it"
        if detected != kind
        else f"the checkpoint lacks them, though its config.json names {named}"
    )
    shown = ", ".join(random[:3]) + (", ..." if len(random) > 3 else "")
    raise ValueError(
        f"Model {name!r} cannot be served as a {kind}: {len(random)} of the weights a {kind} needs would be random"
        f" ({shown}); {why}."
    )


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers draws a "Loading weights" bar on stderr, which a server's log records as noise."""
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def read_max_length(source: Source, tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> int:
    """The longest input the model takes, as sentence-transformers computes it."""
    st_config = source.read_json("sentence_bert_config.json")
    if isinstance(st_config, dict) and isinstance(st_config.get("max_seq_length"), int):
        return int(st_config["max_seq_length"])
    limits = [int(tokenizer.model_max_length)]
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    if min(limits) >= _NO_LIMIT:
        raise ValueError(f"Model {source.name!r} states no maximum input length.")
    return min(limits)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Padding is masked out, so any valid id serves when the tokenizer has no pad token."""
    pad = tokenizer.pad_token_id
    return pad if isinstance(pad, int) else 0


def limits(
    tokenizer: PreTrainedTokenizerBase, truncate: int | None, side: TruncationSide | None, max_length: int
) -> Limits:
    """What a request's truncation fields mean for this model; bad values are the request's error."""
    cut_side = side or cast(TruncationSide, tokenizer.truncation_side)
    if truncate is None:
        return Limits(None, max_length, cut_side)
    if truncate == -1:
        return Limits(max_length, max_length, cut_side)
    if truncate > max_length:
        raise TruncationTooLarge()
    if truncate < 1:
        raise InvalidRequest(
            "truncate_prompt_tokens must be -1 or a positive number of tokens.", "truncate_prompt_tokens"
        )
    return Limits(truncate, max_length, cut_side)


def split_budget(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many content tokens each part keeps: the tokenizers library's longest-first rule.

    The shorter part is kept whole when it fits in half the budget; otherwise both get half (the longer
    part, or the second one on a tie, gets the odd token). A single text is a pair with an empty second part.
    """
    if first + second <= budget:
        return first, second
    short = min(first, second)
    if 2 * short <= budget:
        return (short, budget - short) if first <= second else (budget - short, short)
    half, odd = divmod(budget, 2)
    return (half + odd, half) if first > second else (half, half + odd)


def tokenize(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], *, special_tokens: bool, checkpoint: Checkpoint
) -> list[Encoding]:
    """Tokenize untruncated: every chunk of :func:`tokenize_chunks`, in one list."""
    return [encoding for chunk in tokenize_chunks(tokenizer, texts, special_tokens, checkpoint) for encoding in chunk]


def tokenize_chunks(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], special_tokens: bool, checkpoint: Checkpoint
) -> Iterator[list[Encoding]]:
    """Tokenize untruncated, a chunk of about ``TOKENIZE_CHUNK_CHARS`` characters per call (the Rust tokenizer
    runs each chunk in parallel), calling ``checkpoint`` before each chunk so an abandoned request stops here.

    A caller that keeps only what it takes from each chunk's encodings holds one chunk of them at a time: an
    encoding keeps every token's string, offsets and masks in the tokenizer threads' heaps, which stay in the
    process once freed, so holding all of a 10,000-document rerank's encodings at once left 46 MB more behind
    after tokenizing (4.7 KiB per 30-token document) than one chunk at a time does."""
    backend = tokenizer.backend_tokenizer
    start = 0
    while start < len(texts):
        end, chars = start + 1, len(texts[start])
        while end < len(texts) and chars + len(texts[end]) <= TOKENIZE_CHUNK_CHARS:
            chars += len(texts[end])
            end += 1
        checkpoint()
        yield backend.encode_batch(list(texts[start:end]), add_special_tokens=special_tokens)
        start = end


def tokenize_distinct(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], checkpoint: Checkpoint
) -> dict[str, Encoding]:
    """Each distinct text's tokens (no special tokens), tokenized once: a 1:N request's query once, not N times."""
    distinct = list(dict.fromkeys(texts))
    return dict(zip(distinct, tokenize(tokenizer, distinct, special_tokens=False, checkpoint=checkpoint), strict=True))


def check_pair_options(options: PairOptions, max_length: int, kind: ModelKind, *, chunks: bool) -> None:
    """Refuse what a pair scorer of this kind cannot do (an instruction needs an LLM reranker's prompt,
    windows a scorer that ``chunks``), then vLLM's checks of the side cuts."""
    if options.instruction is not None and kind != "llm-reranker":
        raise InvalidRequest(f"instruction fills an LLM reranker's prompt; a {kind} has none.", "instruction")
    if options.chunking is not None and not chunks:
        raise InvalidRequest(
            f"A {kind} embeds each document on its own and cannot score it by windows; "
            "cut long documents with truncate_prompt_tokens instead.",
            "max_chunks_per_doc",
        )
    check_side_cuts(options, max_length)


def check_side_cuts(options: PairOptions, max_length: int) -> None:
    """vLLM's checks of ``max_tokens_per_query`` and ``max_tokens_per_doc``, with its messages."""
    for name, value in (
        ("max_tokens_per_query", options.query_tokens),
        ("max_tokens_per_doc", options.document_tokens),
    ):
        if value < 0:
            raise InvalidRequest(f"{name} must be a non-negative integer", name)
        if value >= max_length:
            raise InvalidRequest(f"{name} ({value}) must be less than max_model_len ({max_length}).", name)


def cut_texts(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int, checkpoint: Checkpoint
) -> list[str]:
    """Each text cut to its first ``max_tokens`` tokens (no special tokens), at the character where the last
    kept token ends, as vLLM does with the offset mapping; 0 leaves them whole."""
    if max_tokens == 0:
        return list(texts)
    distinct = list(dict.fromkeys(texts))  # a 1:N request's query once
    encodings = tokenize(tokenizer, distinct, special_tokens=False, checkpoint=checkpoint)
    cut = {
        text: text if len(encoding.ids) <= max_tokens else text[: encoding.offsets[max_tokens - 1][1]]
        for text, encoding in zip(distinct, encodings, strict=True)
    }
    return [cut[text] for text in texts]


def encode_texts(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    limits: Limits,
    checkpoint: Checkpoint,
) -> list[Encoded]:
    """Each text on its own, with the tokenizer's special tokens, checked or cut to the limits."""
    check_chars(((len(text),) for text in texts), limits)
    with_types = "token_type_ids" in tokenizer.model_input_names
    encoded: list[Encoded] = []
    for chunk in tokenize_chunks(tokenizer, texts, True, checkpoint):
        first = len(encoded)
        encoded += [fit(encoding, first + i, limits, with_types) for i, encoding in enumerate(chunk)]
    return encoded


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase,
    firsts: Sequence[str],
    seconds: Sequence[str],
    limits: Limits,
    checkpoint: Checkpoint,
) -> list[Encoded]:
    """Pair i is (firsts[i], seconds[i]) as one sequence with the pair template's special tokens
    (see :func:`joined_pairs`)."""
    if len(firsts) != len(seconds):
        raise ValueError(f"Got {len(firsts)} queries but {len(seconds)} documents; pairs need both.")
    check_chars(zip(map(len, firsts), map(len, seconds), strict=True), limits)
    with_types = "token_type_ids" in tokenizer.model_input_names
    pairs = joined_pairs(tokenizer, firsts, seconds, checkpoint)
    return [fit(pair, index, limits, with_types, parts) for index, (pair, parts) in enumerate(pairs)]


def joined_pairs(
    tokenizer: PreTrainedTokenizerBase, firsts: Sequence[str], seconds: Sequence[str], checkpoint: Checkpoint
) -> Iterator[tuple[Encoding, tuple[Encoding, Encoding]]]:
    """Pair i joined by the tokenizer's own post-processor (what tokenizing the pair does inside the tokenizers
    library), with the two halves it was joined from, in order.

    Each distinct first text is tokenized once, up front (a 1:N request's query once, not N times); the
    second texts a chunk at a time (:func:`tokenize_chunks`), so a rerank holds one chunk of its documents'
    encodings at a time, not all of them. ``checkpoint`` runs every ``PAIRS_PER_CHECKPOINT`` pairs as well.
    """
    heads = tokenize_distinct(tokenizer, firsts, checkpoint)
    tails = (encoding for chunk in tokenize_chunks(tokenizer, seconds, False, checkpoint) for encoding in chunk)
    backend = tokenizer.backend_tokenizer
    for index, (first, second) in enumerate(zip(firsts, tails, strict=True)):
        if index % PAIRS_PER_CHECKPOINT == 0:
            checkpoint()
        parts = heads[first], second
        yield backend.post_process(*parts, add_special_tokens=True), parts


def encode_pair_windows(
    tokenizer: PreTrainedTokenizerBase,
    firsts: Sequence[str],
    seconds: Sequence[str],
    max_length: int,
    chunking: Chunking,
    checkpoint: Checkpoint,
) -> tuple[list[Encoded], list[list[tuple[int, int]]]]:
    """Pair i as windows: the joined pair with only a window of the second text's tokens, each window as long
    as fits beside the first text and the special tokens. Also, per pair, its windows' character ranges in
    the second text."""
    with_types = "token_type_ids" in tokenizer.model_input_names
    encoded: list[Encoded] = []
    spans: list[list[tuple[int, int]]] = []
    for index, (pair, parts) in enumerate(joined_pairs(tokenizer, firsts, seconds, checkpoint)):
        ids, types = pair.ids, pair.type_ids
        start, length = _pair_spans(ids, *parts)[1]
        rest = len(ids) - length
        if rest >= max_length:  # not one token of the second text fits beside the first
            raise InputTooLong(index, rest + 1, max_length)
        windows = token_windows(length, max_length - rest, chunking)
        for low, high in windows:
            keep = [*range(start), *range(start + low, start + high), *range(start + length, len(ids))]
            kept_types = token_array([types[i] for i in keep]) if with_types else None
            encoded.append(Encoded(token_array([ids[i] for i in keep]), kept_types))
        offsets = parts[1].offsets
        spans.append([(offsets[low][0], offsets[high - 1][1]) if high > low else (0, 0) for low, high in windows])
    return encoded, spans


def check_chars(inputs: Iterable[tuple[int, ...]], limits: Limits) -> None:
    """Refuse, before any tokenizing, an input whose characters cannot fit in the model without truncation."""
    if limits.keep is not None:
        return
    most = limits.max_length * MAX_CHARS_PER_TOKEN
    for index, parts in enumerate(inputs):
        if sum(parts) > most:
            raise InputTooLong(index, None, limits.max_length, chars=sum(parts))


def fit(
    encoding: Encoding,
    index: int,
    limits: Limits,
    with_types: bool,
    parts: tuple[Encoding, Encoding] | None = None,
) -> Encoded:
    """Check or truncate one untruncated encoding (``parts``: the two halves a pair was joined from).

    Truncation drops content tokens only, so [CLS]/[SEP] and the like stay where the tokenizer put them;
    each part's content is one contiguous run of positions, so the cut is two slices per part.
    """
    ids, types = encoding.ids, encoding.type_ids if with_types else None
    limit, max_length = limits.keep, limits.max_length
    if limit is None and len(ids) > max_length:
        raise InputTooLong(index, len(ids), max_length)
    if limit is None or len(ids) <= limit:
        return Encoded(token_array(ids), None if types is None else token_array(types))
    spans = _pair_spans(ids, *parts) if parts else _single_span(encoding.sequence_ids)
    n_special = len(ids) - sum(count for _, count in spans)
    if limit < n_special:
        raise InvalidRequest(
            f"truncate_prompt_tokens must be at least {n_special} for this model.", "truncate_prompt_tokens"
        )
    keep = split_budget(spans[0][1], spans[1][1], limit - n_special)
    dropped = []
    for (start, count), kept in zip(spans, keep, strict=True):
        first_kept = start if limits.side == "right" else start + count - kept
        dropped += [(start, first_kept), (first_kept + kept, start + count)]
    positions = _without(len(ids), dropped)
    kept_types = None if types is None else token_array([types[i] for i in positions])
    return Encoded(token_array([ids[i] for i in positions]), kept_types, truncated=True)


def _single_span(sequence_ids: list[int | None]) -> list[tuple[int, int]]:
    """Where a single text's content starts and how long it is, plus an empty second part."""
    count = sequence_ids.count(0)
    start = sequence_ids.index(0) if count else 0
    return [(start, count), (start + count, 0)]


def _pair_spans(ids: list[int], first: Encoding, second: Encoding) -> list[tuple[int, int]]:
    """Where each half's content sits in the joined pair (the post-processor only adds tokens around them)."""
    spans = []
    position = 0
    for part in (first.ids, second.ids):
        start = position
        while ids[start : start + len(part)] != part:
            start += 1
            if start + len(part) > len(ids):
                raise InvalidRequest("The tokenizer's pair template reorders the texts; scorekit cannot truncate it.")
        spans.append((start, len(part)))
        position = start + len(part)
    return spans


def _without(length: int, dropped: Sequence[tuple[int, int]]) -> list[int]:
    """The positions left after removing the half-open ``dropped`` ranges."""
    cuts = sorted((start, end) for start, end in dropped if end > start)
    kept: list[int] = []
    previous = 0
    for start, end in cuts:
        kept.extend(range(previous, start))
        previous = end
    kept.extend(range(previous, length))
    return kept


def pad_batch(batch: Sequence[Encoded], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-pad to the longest input; the attention mask hides the padding from attention and pooling."""
    ids, mask = padded([item.input_ids for item in batch], pad_id)
    inputs = {"input_ids": ids, "attention_mask": mask}
    types = [item.token_type_ids for item in batch if item.token_type_ids is not None]
    if len(types) == len(batch):
        inputs["token_type_ids"] = padded(types, 0)[0]
    if device.type == "cuda":
        # From page-locked memory the copy is one DMA with no staging copy, and it is queued without waiting:
        # the forward that reads it runs on the same stream, and torch keeps the pinned block until it is done.
        return {key: value.pin_memory().to(device, non_blocking=True) for key, value in inputs.items()}
    return {key: value.to(device) for key, value in inputs.items()}


def padded(rows: Sequence[array[int]], value: int, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows as one int64 tensor, padded with ``value`` to the longest on the right (or the left), and the
    mask of their real tokens (1; padding 0).

    The rows' bytes are joined and copied into the tensor's unpadded places in one go (row-major, as joined),
    so no Python int is made per token."""
    lengths = torch.tensor([len(row) for row in rows])
    width = int(lengths.max())
    places = torch.arange(width)
    real = places >= (width - lengths)[:, None] if left else places < lengths[:, None]
    ids = torch.full(real.shape, value, dtype=torch.long)
    joined = bytearray().join(rows)
    if joined:  # frombuffer refuses an empty buffer
        ids[real] = torch.frombuffer(joined, dtype=torch.int32).long()
    return ids, real.long()
