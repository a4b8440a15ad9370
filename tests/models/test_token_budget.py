"""The batch token budget of ``--max-batch-tokens auto``: the CPU's fixed default, a number given wins, and on a
GPU the arithmetic from the measured bytes per token (the measure itself: tests/models/test_cuda.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scorekit.models import load_backend
from scorekit.models.budget import CPU_BATCH_TOKENS, MEMORY_SHARE, batch_token_budget, budget_for, token_budgets
from scorekit.settings import EngineConfig, ModelSpec
from tests.tiny_models import build_cross_encoder

GiB = 2**30


def test_on_a_cpu_auto_is_the_default_and_a_number_given_wins(tmp_path: Path) -> None:
    folder = str(build_cross_encoder(tmp_path / "ce"))
    backend = load_backend(folder)
    auto = batch_token_budget(backend, ModelSpec(folder))
    assert (auto.tokens, auto.source) == (CPU_BATCH_TOKENS, "the CPU default")
    given = batch_token_budget(backend, ModelSpec(folder, engine=EngineConfig(max_batch_tokens=777)))
    assert (given.tokens, given.source) == (777, "--max-batch-tokens")


def test_each_served_model_gets_its_own_budget_by_name(tmp_path: Path) -> None:
    folder = str(build_cross_encoder(tmp_path / "ce"))
    backend = load_backend(folder)
    specs = [ModelSpec(folder, "a"), ModelSpec(folder, "b", engine=EngineConfig(max_batch_tokens=4096))]
    budgets = token_budgets(specs, {"a": backend, "b": backend})
    assert {name: budget.tokens for name, budget in budgets.items()} == {"a": CPU_BATCH_TOKENS, "b": 4096}


def test_the_budget_is_a_share_of_the_free_memory_split_among_the_model_threads() -> None:
    per_token = 96 * 2**10
    alone = budget_for(10 * GiB, per_token, max_length=512, max_batch_size=1024, workers=1)
    assert alone == int(MEMORY_SHARE * 10 * GiB // per_token) == 87381
    two = budget_for(10 * GiB, per_token, max_length=512, max_batch_size=1024, workers=2)
    assert two == int(MEMORY_SHARE * 5 * GiB // per_token)
    # What a batch of that many tokens would allocate stays within the share, for each thread's batch at once.
    assert 2 * two * per_token <= MEMORY_SHARE * 10 * GiB


def test_the_budget_never_passes_the_largest_batch_the_size_cap_allows() -> None:
    assert budget_for(80 * GiB, 2**10, max_length=512, max_batch_size=128, workers=1) == 128 * 512


def test_a_device_without_room_for_one_longest_input_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as refused:
        budget_for(256 * 2**20, 2**20, max_length=512, max_batch_size=128, workers=2)
    message = str(refused.value)
    assert message.startswith("The GPU has room for 102 tokens per batch per model thread (of 2), fewer than one")
    assert "--max-model-len" in message and "\n" not in message
