"""Every knob in one place: the CLI fills it from flags and environment variables, tests build it.

A leaf module: importing it loads no torch, so parsing flags stays fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

ModelKind = Literal["cross-encoder", "bi-encoder", "causal-lm"]
MODEL_KINDS: tuple[ModelKind, ...] = get_args(ModelKind)

# What the embedded default model answers to in `model` fields and /v1/models.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine's batching and admission limits (see DESIGN.md section 4)."""

    max_batch_tokens: int = 16384
    max_batch_size: int = 128
    max_queued_items: int = 50_000
    max_concurrent_requests: int = 512

    def __post_init__(self) -> None:
        # An embedding app builds these without the CLI's checks: a zero batch size would kill the worker
        # at the first request, so it is refused here, where the mistake is made.
        for name in (f.name for f in fields(self)):
            _at_least(self, name, 1)


@dataclass(frozen=True, slots=True)
class Settings:
    model: str | None = None  # None: the embedded all-MiniLM-L6-v2
    served_model_name: str | None = None
    kind: ModelKind | None = None  # None: detected from the model's config
    device: str = "cpu"
    dtype: str = "auto"
    engine: EngineConfig = field(default_factory=EngineConfig)
    max_body_bytes: int = 16 << 20
    max_items_per_request: int = 10_000
    shutdown_timeout: float = 30.0
    limit_concurrency: int = 0  # most open connections; 0: derived from the open-file limit (connections.py)
    header_timeout: float = 10.0  # seconds a connection gets to send a complete request head

    def __post_init__(self) -> None:
        _at_least(self, "max_body_bytes", 1)
        _at_least(self, "max_items_per_request", 1)
        _at_least(self, "limit_concurrency", 0)
        _seconds(self, "shutdown_timeout", zero=True)
        _seconds(self, "header_timeout", zero=False)
        if self.kind is not None and self.kind not in MODEL_KINDS:
            raise ValueError(f"Settings.kind must be one of {', '.join(MODEL_KINDS)} or None, not {self.kind!r}")


def _at_least(settings: object, name: str, low: int) -> None:
    value = getattr(settings, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{type(settings).__name__}.{name} must be a whole number, at least {low}, not {value!r}")


def _seconds(settings: object, name: str, *, zero: bool) -> None:
    value = getattr(settings, name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not zero):
        bound = "0 or more" if zero else "more than 0"
        raise ValueError(f"{type(settings).__name__}.{name} must be a number of seconds, {bound}, not {value!r}")
