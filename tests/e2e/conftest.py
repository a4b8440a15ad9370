"""Servers for the end-to-end tests: real servers on loopback, real models loaded with transformers.

Most fixtures serve under uvicorn (what `scorekit serve` runs). ``server`` is parametrized over every
server in ``tests.live.SERVERS``; a test that takes ``served_minilm`` runs once under each of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import EngineConfig, Settings
from tests.live import SERVERS, Live, serve
from tests.tiny_models import build_causal_lm, build_cross_encoder


@pytest.fixture(scope="session")
def minilm_app() -> ScorekitApp:
    return create_app(Settings())


@pytest.fixture(scope="session")
def minilm(minilm_app: ScorekitApp) -> Iterator[Live]:
    """The embedded default model, exactly as `scorekit serve` serves it."""
    with serve(minilm_app) as live:
        yield live


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


@pytest.fixture(scope="session")
def causal_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_causal_lm(tmp_path_factory.mktemp("causal-lm"))


@pytest.fixture(scope="session")
def cross_encoder(cross_encoder_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(cross_encoder_dir), name="tiny-ce"))) as live:
        yield live


@pytest.fixture(scope="session")
def causal_lm(causal_lm_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(causal_lm_dir), name="tiny-lm"))) as live:
        yield live


# Small batches, so that a large request spans many of them (disconnect and fairness tests).
SMALL_BATCHES = EngineConfig(max_batch_size=16, max_batch_tokens=4096)


@pytest.fixture(scope="session", params=SERVERS)
def server(request: pytest.FixtureRequest) -> str:
    """The ASGI server a test runs under: uvicorn, hypercorn or granian."""
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def served_minilm_app(server: str) -> ScorekitApp:
    """The app behind ``served_minilm``, for its worker's counters (one app per server)."""
    return create_app(Settings.for_model(engine=SMALL_BATCHES))


@pytest.fixture(scope="session")
def served_minilm(server: str, served_minilm_app: ScorekitApp) -> Iterator[Live]:
    """The embedded model, with small batches, under each server in turn (``live.server`` says which)."""
    with serve(served_minilm_app, server) as live:
        yield live


@pytest.fixture
def small_batches() -> Iterator[tuple[ScorekitApp, Live]]:
    """MiniLM with small batches, so a large request spans many of them."""
    app = create_app(Settings.for_model(engine=SMALL_BATCHES))
    with serve(app) as live:
        yield app, live
