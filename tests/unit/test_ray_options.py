"""How a Ray Serve deployment is sized from the engine's limits, and what its health check reports; no Ray
needed (scorekit.deploy.options and scorekit.deploy.replica import none)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scorekit.app import create_app
from scorekit.deploy.options import Autoscaling, RayOptions, deployment_options
from scorekit.deploy.replica import ReplicaApp
from scorekit.settings import EngineConfig, ModelSpec, Settings


def test_a_fixed_deployment_takes_the_engines_admission_limit() -> None:
    options = deployment_options(Settings(shutdown_timeout=12), RayOptions(replicas=3, num_gpus=1, num_cpus=2))
    assert options == {
        "name": "scorekit",
        "max_ongoing_requests": 512,  # Ray's default, 5, would never fill a batch of 128
        "ray_actor_options": {"num_cpus": 2, "num_gpus": 1},
        "graceful_shutdown_timeout_s": 12,
        "num_replicas": 3,
    }


def test_autoscaling_aims_at_a_batch_below_the_cap() -> None:
    settings = Settings.for_model(engine=EngineConfig(max_batch_size=32, max_concurrent_requests=100))
    options = deployment_options(settings, RayOptions(autoscaling=Autoscaling(0, 6)))
    assert options["max_ongoing_requests"] == 100
    assert options["autoscaling_config"] == {
        "min_replicas": 0,
        "max_replicas": 6,
        "initial_replicas": 1,
        "target_ongoing_requests": 32,
    }
    assert "num_replicas" not in options
    small_cap = Settings.for_model(engine=EngineConfig(max_batch_size=32, max_concurrent_requests=40))
    assert (
        deployment_options(small_cap, RayOptions(autoscaling=Autoscaling(1, 2)))["autoscaling_config"][
            "target_ongoing_requests"
        ]
        == 20
    )  # half the cap: Ray scales out before it queues


def test_several_models_take_the_smallest_limit_and_the_largest_batch() -> None:
    models = (
        ModelSpec(name="a", engine=EngineConfig(max_concurrent_requests=300, max_batch_size=16)),
        ModelSpec(name="b", engine=EngineConfig(max_concurrent_requests=200, max_batch_size=64)),
    )
    options = deployment_options(Settings(models=models), RayOptions(autoscaling=Autoscaling(1, 2)))
    assert options["max_ongoing_requests"] == 200
    assert options["autoscaling_config"]["target_ongoing_requests"] == 64


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RayOptions(replicas=0), "replicas must be at least 1"),
        (lambda: Autoscaling(3, 2), "min_replicas <= max_replicas"),
        (lambda: RayOptions(probe_port=70000), "probe_port must be a port number"),
        (
            lambda: deployment_options(
                Settings(), RayOptions(autoscaling=Autoscaling(1, 2, target_ongoing_requests=512))
            ),
            "target_ongoing_requests (512) must be below max_ongoing_requests (512)",
        ),
        (
            lambda: deployment_options(Settings.for_model(device="cuda"), RayOptions(num_gpus=0.5)),
            "--num-gpus 0.5 puts several replicas on one GPU, and --max-batch-tokens auto sizes each one's batches as"
            " if it were alone there: give --max-batch-tokens N",
        ),
    ],
)
def test_impossible_options_are_refused(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_a_shared_gpu_takes_a_number_of_batch_tokens_and_a_whole_one_auto() -> None:
    given = Settings.for_model(device="cuda", engine=EngineConfig(max_batch_tokens=8192))
    assert deployment_options(given, RayOptions(num_gpus=0.5))["ray_actor_options"]["num_gpus"] == 0.5
    whole = deployment_options(Settings.for_model(device="cuda"), RayOptions(num_gpus=1))
    assert whole["ray_actor_options"]["num_gpus"] == 1


def test_the_health_check_names_a_model_that_is_not_loaded() -> None:
    replica = ReplicaApp(create_app(Settings.for_model("./nowhere", name="judge")))
    assert replica.problem() == "the model 'judge' is not loaded"


def from_flags(settings: Settings | None = None, **changes: Any) -> RayOptions:
    """The flags' defaults, as the CLI passes them, with ``changes``."""
    values: dict[str, Any] = {
        "given": (),
        "replicas": 1,
        "min_replicas": None,
        "max_replicas": None,
        "target_ongoing": None,
        "max_ongoing": None,
        "num_gpus": 0.0,
        "num_cpus": 1.0,
        "probe_host": "127.0.0.1",
        "probe_port": None,
    }
    return RayOptions.from_flags(settings or Settings(), **{**values, **changes})


def test_the_flags_rules_live_on_ray_options() -> None:
    """tests/cli/test_ray_flags.py checks each rule through the parser; here the options' own, for an app's code."""
    assert from_flags() == RayOptions()
    assert from_flags(max_replicas=4, given=("max-replicas",)) == RayOptions(autoscaling=Autoscaling(1, 4))
    with pytest.raises(ValueError, match="--header-timeout limits scorekit's own server"):
        from_flags(given=("header-timeout",))
    # Every model must be on the GPU Ray gives a replica, not only the first.
    one_on_cpu = Settings(models=(ModelSpec("a", device="cuda"), ModelSpec("b")))
    with pytest.raises(ValueError, match="--num-gpus gives each replica a GPU: add --device cuda"):
        from_flags(one_on_cpu, num_gpus=1)
    assert from_flags(Settings.for_model(device="cuda"), num_gpus=1).num_gpus == 1
