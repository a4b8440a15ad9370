"""What every endpoint reaches through ``request.state``: the served models and the server's bookkeeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scorekit.api.decoding import DecodeBudget
from scorekit.load import LoadCounter
from scorekit.metrics import Metrics
from scorekit.registry import ModelRegistry
from scorekit.settings import Settings


@dataclass
class ServerState:
    settings: Settings
    models: ModelRegistry
    load: LoadCounter
    metrics: Metrics
    # Whether the server drains (/health answers 503 then): the app hands in its drain's flag, which lives
    # with the middleware that act on it.
    draining: Callable[[], bool] = lambda: False
    openapi: bytes = b"{}"
    started_at: int = field(default_factory=lambda: int(time.time()))
    decoding: DecodeBudget = field(default_factory=DecodeBudget)  # the bytes of bodies being decoded at once
