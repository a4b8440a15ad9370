"""Every knob in one place: the CLI fills it from flags and environment variables, tests build it.

A leaf module: importing it loads no torch, so parsing flags stays fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ModelKind = Literal["cross-encoder", "bi-encoder", "causal-lm"]

# What the embedded default model answers to in `model` fields and /v1/models.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine's batching and admission limits (see DESIGN.md section 4)."""

    max_batch_tokens: int = 16384
    max_batch_size: int = 128
    max_queued_items: int = 50_000
    max_concurrent_requests: int = 512


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
