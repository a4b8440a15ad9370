"""Every knob in one place: the CLI fills it from flags and environment variables, tests build it."""

from __future__ import annotations

from dataclasses import dataclass, field

from scorekit.engine import EngineConfig
from scorekit.models.base import ModelKind

# What the embedded default model answers to in `model` fields and /v1/models.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


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
