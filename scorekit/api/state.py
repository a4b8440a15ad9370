"""What every endpoint reaches through ``request.state``: the served models and the server's bookkeeping."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from scorekit.api.decoding import DecodeBudget
from scorekit.http import HTTPError
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
    draining: bool = False
    openapi: bytes = b"{}"
    started_at: int = field(default_factory=lambda: int(time.time()))
    decoding: DecodeBudget = field(default_factory=DecodeBudget)  # the bytes of bodies being decoded at once


def shutting_down(message: str = "The server is shutting down.") -> HTTPError:
    """A draining server's 503. ``Connection: close`` sends a keep-alive client (or a balancer's pooled
    connection) to reconnect, and so to another replica, instead of queueing behind this one."""
    return HTTPError(503, message, headers=[(b"retry-after", b"1"), (b"connection", b"close")])
