"""The server's copy of a model that a model host process runs (``--model-host process``): loaded without weights,
it plans and tokenizes as the full model does and has its card, its forward is refused, and a host whose model is
not the one the server plans for stops start-up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from scorekit.app import checked_host, load_models
from scorekit.model_host import Card
from scorekit.models import load_spec
from scorekit.models.base import Backend, Encoded, PairScorer, no_checkpoint, token_array
from scorekit.models.budget import TokenBudget
from scorekit.models.loaded import NoWeights
from scorekit.settings import EngineConfig, ModelSpec, Settings
from scorekit.tasks import PairOptions
from tests.tiny_models import build_causal_lm, build_cross_encoder


def _card(backend: Backend) -> Card:
    return Card(backend.name, backend.kind, backend.max_length)


def _weights(backend: Backend) -> list[torch.Tensor]:
    model: torch.nn.Module = backend._model  # type: ignore[attr-defined]
    return [*model.parameters(), *model.buffers()]


@pytest.mark.parametrize(
    "build", [build_cross_encoder, build_causal_lm, None], ids=["cross-encoder", "causal-lm", "minilm"]
)
def test_the_weightless_copy_has_the_models_card_and_plans_and_no_weights(
    build: Callable[[Path], Path] | None, tmp_path: Path
) -> None:
    spec = ModelSpec(None if build is None else str(build(tmp_path)), max_model_len=100)
    full, copy = load_spec(spec), load_spec(spec, weights=False)
    assert _card(copy) == _card(full)
    assert all(tensor.device.type == "meta" for tensor in _weights(copy))
    if isinstance(full, PairScorer):  # the same plan: the same token ids go to the host
        assert isinstance(copy, PairScorer)
        side1, side2 = ["a query"], ["one document", "another, longer document"]
        ran = full.plan_pairs(side1, side2, PairOptions()).encode(no_checkpoint).inputs
        sent = copy.plan_pairs(side1, side2, PairOptions()).encode(no_checkpoint).inputs
        assert sent == ran
    with pytest.raises(NoWeights, match="has no weights in this process"):
        copy.forward([Encoded(token_array([101, 102]), label_token_ids=(0,))])


def test_load_models_loads_a_process_hosted_model_without_weights_and_leaves_its_budget_to_the_host(
    tmp_path: Path,
) -> None:
    settings = Settings.for_model(str(build_cross_encoder(tmp_path)), name="tiny", host="process")
    loaded = load_models(settings)
    assert all(tensor.device.type == "meta" for tensor in _weights(loaded.backends["tiny"]))
    assert "tiny" not in loaded.budgets


def test_two_models_on_one_gpu_cannot_leave_a_hosts_budget_to_auto() -> None:
    shared = (ModelSpec(name="a", device="cuda", host="process"), ModelSpec(name="b", device="cuda:0"))
    with pytest.raises(ValueError, match="'a' runs in a model host process on cuda, which another served model"):
        load_models(Settings(models=shared), dict.fromkeys(("a", "b"), object()))  # type: ignore[arg-type]
    sized = ModelSpec(name="a", device="cuda", host="process", engine=EngineConfig(max_batch_tokens=4096))
    assert load_models(Settings(models=(sized,)), {"a": object()}).budgets == {}  # type: ignore[dict-item]


def test_a_host_whose_model_is_not_the_one_the_server_plans_for_is_refused() -> None:
    card, budget = Card("m", "cross-encoder", 128), TokenBudget(4096, "sized for cuda:0")
    assert checked_host("m", card, Card("m", "cross-encoder", 128), budget) is budget
    for other in (Card("n", "cross-encoder", 128), Card("m", "bi-encoder", 128), Card("m", "cross-encoder", 512)):
        with pytest.raises(ValueError, match="its host process loaded"):
            checked_host("m", card, other, budget)
