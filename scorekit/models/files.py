"""A model's files: where they live (a folder or the hub's cache), its JSON files, its kind, the device and
dtype it loads in, its tokenizer and weights (refused when some would be random), and its length limit."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging
from transformers.utils.hub import cached_file

from scorekit.choices import DTYPES, device_error

from .base import ModelKind

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Tokenizers without a limit report a sentinel near 1e30 as model_max_length.
_NO_LIMIT = 10**12


@dataclass(frozen=True, slots=True)
class Source:
    """Where a model's files live: a local folder is read offline, anything else is a hub name.

    A hub name is read from the local Hugging Face cache alone while the hub cannot be reached (or
    ``HF_HUB_OFFLINE`` is set), so that no file waits out the hub client's retries (five, about 30 s a file); a
    name that is not in the cache either is refused as the Source is made, in one line, with no hub call beyond
    the one quick check of whether the hub answers.
    """

    name: str
    subfolder: str = ""
    trust_remote_code: bool = False  # run the model's own Python code (its config names it), as transformers asks

    def __post_init__(self) -> None:
        if self.is_local or (unreachable := Source.hub_unreachable()) is None or self._in_cache():
            return
        raise ValueError(f"Model {self.name!r} is not a folder nor in the local Hugging Face cache, and {unreachable}.")

    @property
    def is_local(self) -> bool:
        return Path(self.name).is_dir()

    @staticmethod
    @functools.cache
    def hub_unreachable() -> str | None:
        """Why the hub cannot be reached, as the end of a sentence, or None when it answers. Asked once a process:
        one request to ``HF_ENDPOINT`` with a short timeout and no retries (any answer will do, even an error)."""
        from huggingface_hub import constants, get_session

        if constants.is_offline_mode():
            return "HF_HUB_OFFLINE is set, so the hub is not asked"
        try:
            get_session().head(constants.ENDPOINT, timeout=5.0)
        except Exception:  # whatever the HTTP client raises: no connection, no name, no answer in time
            return f"the hub cannot be reached at {constants.ENDPOINT}"
        return None

    def _in_cache(self) -> bool:
        from huggingface_hub import try_to_load_from_cache

        prefix = f"{self.subfolder}/" if self.subfolder else ""
        for filename in ("config.json", "modules.json"):
            try:
                if isinstance(try_to_load_from_cache(self.name, prefix + filename), str):
                    return True
            except Exception:  # a name the hub would refuse is in no cache
                return False
        return False

    def kwargs(self) -> dict[str, Any]:
        """The location arguments every ``from_pretrained`` call takes (see the class's docstring)."""
        local = self.is_local or Source.hub_unreachable() is not None
        return {"local_files_only": local, "subfolder": self.subfolder}

    def pretrained_kwargs(self) -> dict[str, Any]:
        """What every ``from_pretrained`` call takes: the location, and whether the model's own code may run."""
        return {**self.kwargs(), "trust_remote_code": self.trust_remote_code}

    def path_of(self, filename: str) -> str | None:
        """Where one of the model's files is on this machine (a hub name's from its cache), or None when it has no
        such file (or it cannot be fetched)."""
        with loading(self.name):
            path: str | None = cached_file(
                self.name,
                filename,
                **self.kwargs(),
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
            )
            return path

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


@dataclass(frozen=True, slots=True)
class Detection:
    """The kind a model is served as, and why: the file or field that decided it (or ``--model-kind``), in the
    words of the start-up log and ``scorekit check``."""

    kind: ModelKind
    why: str


def kind_of(architectures: Sequence[str]) -> ModelKind | None:
    """The kind a config's ``architectures`` name: a bare encoder (``BertModel``) is a bi-encoder; None for one
    that fits no kind (``BertForMaskedLM``, ``T5ForConditionalGeneration``) or none named."""
    if "JinaForRanking" in architectures:  # jina-reranker-v3: a Qwen3 backbone and a projector (models/listwise.py)
        return "listwise-reranker"
    if "HF_ColBERT" in architectures:  # a Stanford ColBERT: an encoder and its projection (models/late_layout.py)
        return "late-interaction"
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return "cross-encoder"
    if any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        return "causal-lm"
    if any(name.endswith("Model") for name in architectures):
        return "bi-encoder"
    return None


def load_model(
    auto_class: Any, source: Source, device: torch.device, dtype: torch.dtype, kind: ModelKind
) -> PreTrainedModel:
    """Load the weights in ``dtype``, move them to ``device``, and switch to eval mode.

    Refuses a model that transformers had to complete with random weights (a cross-encoder folder loaded as a
    causal LM gets a random LM head): it would serve scores that mean nothing, with no error anywhere.
    """
    with loading(source.name), quiet_loading():
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
    """Refuse ``missing`` weights, except a pooler's for a bi-encoder, a late-interaction model or a bge-m3 (which
    read the token vectors, never the pooler)."""
    pools_itself = kind in ("bi-encoder", "late-interaction", "bge-m3")
    random = sorted(key for key in missing if not (pools_itself and ".pooler." in f".{key}"))
    if not random:
        return
    architectures = list(getattr(model.config, "architectures", None) or [])
    detected = kind_of(architectures)
    named = ", ".join(architectures) or "no architecture"
    if detected is None:
        why = f"its config.json names {named}, which fits no kind scorekit serves"
    elif detected != kind:
        why = f"its config.json names {named}, which is a {detected}: leave the model kind out to detect it"
    else:
        why = f"the checkpoint lacks them, though its config.json names {named}"
    shown = ", ".join(random[:3]) + (", ..." if len(random) > 3 else "")
    raise ValueError(
        f"Model {name!r} cannot be served as a {kind}: {len(random)} of the weights a {kind} needs would be random"
        f" ({shown}); {why}."
    )


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers draws a "Loading weights" bar on stderr, and logs a table of the checkpoint's keys its class
    does not use (a listwise reranker's projector, which scorekit reads apart), both noise in a server's log:
    what matters of a load is :func:`_check_trained`'s one line."""
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    report = logging.getLogger("transformers.modeling_utils")
    report.addFilter(_no_load_report)
    try:
        yield
    finally:
        report.removeFilter(_no_load_report)
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _no_load_report(record: logging.LogRecord) -> bool:
    return "LOAD REPORT" not in record.getMessage()


def read_max_length(source: Source, tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig) -> tuple[int, str]:
    """The longest input the model takes, as sentence-transformers computes it, and where it was read."""
    folder = f"{source.subfolder}/" if source.subfolder else ""
    st_config = source.read_json("sentence_bert_config.json")
    if isinstance(st_config, dict) and isinstance(st_config.get("max_seq_length"), int):
        return int(st_config["max_seq_length"]), f"{folder}sentence_bert_config.json's max_seq_length"
    limits = {"the tokenizer's model_max_length": int(tokenizer.model_max_length)}
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits[f"{folder}config.json's max_position_embeddings"] = positions
    where, length = min(limits.items(), key=lambda item: item[1])
    if length >= _NO_LIMIT:
        raise ValueError(f"Model {source.name!r} states no maximum input length.")
    return length, where
