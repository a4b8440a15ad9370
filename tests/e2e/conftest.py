"""Servers for the end-to-end tests: real uvicorn on loopback, real models loaded with transformers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import EngineConfig
from scorekit.settings import Settings
from tests.live import Live, serve
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
    with serve(create_app(Settings(model=str(cross_encoder_dir), served_model_name="tiny-ce"))) as live:
        yield live


@pytest.fixture(scope="session")
def causal_lm(causal_lm_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings(model=str(causal_lm_dir), served_model_name="tiny-lm"))) as live:
        yield live


@pytest.fixture
def small_batches() -> Iterator[tuple[ScorekitApp, Live]]:
    """MiniLM with small batches, so a large request spans many of them."""
    app = create_app(Settings(engine=EngineConfig(max_batch_size=16, max_batch_tokens=4096)))
    with serve(app) as live:
        yield app, live
