"""What the backends share: finding a model's files, loading it, its length limit, truncation and padding."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Encoding
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils.hub import cached_file

from .base import Encoded, InputTooLong, TruncationSide, TruncationTooLarge

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Tokenizers without a limit report a sentinel near 1e30 as model_max_length.
_NO_LIMIT = 10**12


@dataclass(frozen=True, slots=True)
class Source:
    """Where a model's files live: a local folder is read offline, anything else is a hub name."""

    name: str
    subfolder: str = ""

    @property
    def is_local(self) -> bool:
        return Path(self.name).is_dir()

    def kwargs(self) -> dict[str, Any]:
        """The location arguments every ``from_pretrained`` call takes."""
        return {"local_files_only": self.is_local, "subfolder": self.subfolder}

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
    if re.fullmatch(r"cpu|cuda(:\d+)?", device) is None:
        raise ValueError(f"Unsupported device {device!r}: use 'cpu', 'cuda' or 'cuda:N'.")
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
        raise ValueError(f"Unsupported dtype {dtype!r}: use 'auto', 'float32', 'float16' or 'bfloat16'.")
    return _DTYPES[dtype]


def load_tokenizer(source: Source) -> PreTrainedTokenizerBase:
    """A fast tokenizer with its own truncation and padding switched off.

    The Rust tokenizer keeps truncation and padding as mutable state, and changing it while another thread
    encodes raises "Already borrowed". Clearing it once here means our calls (which never ask the tokenizer
    to truncate or pad) never change it, so any thread may tokenize at any time.
    """
    with loading(source.name):
        tokenizer = AutoTokenizer.from_pretrained(source.name, **source.kwargs())
    if not tokenizer.is_fast:
        raise ValueError(f"Model {source.name!r} has no fast tokenizer (tokenizer.json), which scorekit needs.")
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.backend_tokenizer.no_padding()
    return cast(PreTrainedTokenizerBase, tokenizer)


def load_model(auto_class: Any, source: Source, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """Load the weights in ``dtype``, move them to ``device``, and switch to eval mode."""
    with loading(source.name):
        model: PreTrainedModel = auto_class.from_pretrained(source.name, dtype=dtype, **source.kwargs())
    # transformers' stubs lose the binding of its decorated ``to`` and leave ``eval`` untyped.
    model.to(device)  # type: ignore[arg-type]
    model.eval()  # type: ignore[no-untyped-call]
    return model


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


def token_limit(truncate: int | None, max_length: int) -> int | None:
    """How many tokens an input may keep; None means an over-long input is an error."""
    if truncate is None:
        return None
    if truncate == -1:
        return max_length
    if truncate > max_length:
        raise TruncationTooLarge()
    if truncate < 1:
        raise ValueError("truncate_prompt_tokens must be -1 or a positive number of tokens.")
    return truncate


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


def encode_batch(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    truncate: int | None,
    side: TruncationSide | None,
    max_length: int,
) -> list[Encoded]:
    """Tokenize untruncated in one call (the Rust tokenizer runs it in parallel), then check or cut each."""
    limit = token_limit(truncate, max_length)
    if not texts:
        return []
    cut_side = side or cast(TruncationSide, tokenizer.truncation_side)
    with_types = "token_type_ids" in tokenizer.model_input_names
    # verbose=False: the "longer than the maximum" warning is wrong here, since fit() checks every length.
    encoded = tokenizer(text=list(texts), text_pair=None if pairs is None else list(pairs), verbose=False)
    return [
        fit(encoding, index, limit, max_length, cut_side, with_types)
        for index, encoding in enumerate(encoded.encodings or [])
    ]


def fit(
    encoding: Encoding, index: int, limit: int | None, max_length: int, side: TruncationSide, with_types: bool
) -> Encoded:
    """Check or truncate one untruncated encoding.

    Truncation drops content tokens only, so [CLS]/[SEP] and the like stay where the tokenizer put them.
    """
    ids, types = encoding.ids, encoding.type_ids if with_types else None
    if limit is None and len(ids) > max_length:
        raise InputTooLong(index, len(ids), max_length)
    if limit is None or len(ids) <= limit:
        return Encoded(ids, types)
    parts = encoding.sequence_ids
    n_special = parts.count(None)
    if limit < n_special:
        raise ValueError(f"truncate_prompt_tokens must be at least {n_special} for this model.")
    lengths = (parts.count(0), parts.count(1))
    keep = split_budget(*lengths, limit - n_special)
    seen = [0, 0]
    kept: list[int] = []
    for position, part in enumerate(parts):
        if part is not None:
            rank = seen[part]
            seen[part] += 1
            first_kept = 0 if side == "right" else lengths[part] - keep[part]
            if not first_kept <= rank < first_kept + keep[part]:
                continue
        kept.append(position)
    return Encoded([ids[i] for i in kept], None if types is None else [types[i] for i in kept])


def pad_batch(batch: Sequence[Encoded], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-pad to the longest input; the attention mask hides the padding from attention and pooling."""
    ids = [item.input_ids for item in batch]
    inputs = {
        "input_ids": _padded(ids, pad_id),
        "attention_mask": _padded([[1] * len(row) for row in ids], 0),
    }
    types = [item.token_type_ids for item in batch if item.token_type_ids is not None]
    if len(types) == len(batch):
        inputs["token_type_ids"] = _padded(types, 0)
    return {key: value.to(device) for key, value in inputs.items()}


def _padded(rows: Sequence[list[int]], value: int) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [value] * (width - len(row)) for row in rows])
