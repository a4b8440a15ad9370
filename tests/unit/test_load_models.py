"""``load_models``: the one start-up of the models, which ``scorekit serve`` and the lifespan both call. A model
an embedding app (or the CLI) loaded already is not loaded again, but is checked and sized like one it loads."""

from __future__ import annotations

import pytest

from scorekit.app import load_models
from scorekit.models.base import PairScorer
from scorekit.models.budget import CPU_BATCH_TOKENS, TokenBudget
from scorekit.settings import EngineConfig, Settings


class Unchunking:
    """A pair scorer that cannot score a document by windows, as a bi-encoder; never asked to score here."""

    kind = "bi-encoder"
    name = "unchunking"
    chunks_documents = False
    max_length = 128

    def plan_pairs(self, side1: list[str], side2: list[str], options: object) -> object:
        raise AssertionError("load_models runs no request")


def test_a_model_loaded_already_is_checked_like_one_it_loads() -> None:
    assert isinstance(Unchunking(), PairScorer)
    settings = Settings.for_model(name="ready", long_documents="chunk")
    with pytest.raises(ValueError, match="model 'ready' is a bi-encoder, which cannot score a document by windows"):
        load_models(settings, {"ready": Unchunking()})


def test_a_model_loaded_already_is_not_loaded_again_and_gets_its_budget() -> None:
    backend = Unchunking()
    loaded = load_models(Settings.for_model(name="ready"), {"ready": backend})
    assert loaded.backends == {"ready": backend}
    assert loaded.budgets == {"ready": TokenBudget(CPU_BATCH_TOKENS, "the CPU default")}
    given = Settings.for_model(name="ready", engine=EngineConfig(max_batch_tokens=512))
    assert load_models(given, {"ready": backend}).budgets["ready"] == TokenBudget(512, "--max-batch-tokens")
