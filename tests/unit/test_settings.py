"""Settings built in code (an embedding app) get the same bounds as the CLI's flags: a bad value is refused
where it is made, not by a dead worker at the first request."""

from __future__ import annotations

from typing import Any

import pytest

from scorekit.settings import MODEL_KINDS, EngineConfig, ModelSpec, Settings


@pytest.mark.parametrize(
    "name", ["max_batch_tokens", "max_batch_size", "max_queued_items", "max_concurrent_requests", "model_workers"]
)
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_engine_counts_are_whole_and_positive(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"EngineConfig\.{name} must be a whole number, at least 1"):
        EngineConfig(**{name: value})


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_the_small_job_lane_is_a_whole_number_from_zero(value: Any) -> None:
    with pytest.raises(ValueError, match=r"EngineConfig\.small_job_lane must be a whole number, at least 0"):
        EngineConfig(small_job_lane=value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_body_bytes": 0}, "Settings.max_body_bytes must be a whole number, at least 1, not 0"),
        ({"max_items_per_request": -3}, "Settings.max_items_per_request must be a whole number, at least 1, not -3"),
        ({"limit_concurrency": -1}, "Settings.limit_concurrency must be a whole number, at least 0, not -1"),
        ({"shutdown_timeout": -1.0}, "Settings.shutdown_timeout must be a number of seconds, 0 or more, not -1.0"),
        ({"shutdown_timeout": float("nan")}, "Settings.shutdown_timeout must be a number of seconds, 0 or more"),
        ({"header_timeout": 0}, "Settings.header_timeout must be a number of seconds, more than 0, not 0"),
        ({"models": ()}, "Settings.models must be a tuple of at least one ModelSpec, not ()"),
        ({"models": [ModelSpec()]}, "Settings.models must be a tuple of at least one ModelSpec"),
        (
            {"models": (ModelSpec("a"), ModelSpec("b", name="a"))},
            "Settings.models serves two models under one name: a",
        ),
    ],
)
def test_settings_refuse_bad_values(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        Settings(**changes)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"kind": "reranker"},
            f"ModelSpec.kind must be one of {', '.join(MODEL_KINDS)} or None",
        ),
        ({"max_model_len": 0}, "ModelSpec.max_model_len must be a whole number, at least 1, not 0"),
        ({"runtime": "tensorrt"}, "ModelSpec.runtime must be one of torch, onnx, openvino, torchscript"),
        ({"name": " "}, "ModelSpec.name must not be empty"),
        ({"host": "processes"}, "ModelSpec.host must be one of thread, process, not 'processes'"),
        ({"runtime": "onnx", "device": "cuda"}, "--runtime onnx runs on the CPU only, not on 'cuda'"),
        ({"runtime": "openvino", "kind": "causal-lm"}, "--runtime openvino serves bi-encoders and cross-encoders"),
    ],
)
def test_a_model_spec_refuses_bad_values_and_so_does_the_one_model_shorthand(
    changes: dict[str, Any], message: str
) -> None:
    for make in (ModelSpec, Settings.for_model):
        with pytest.raises(ValueError) as raised:
            make(**changes)
        assert str(raised.value).startswith(message)


def test_the_one_model_shorthand_splits_the_model_from_the_server() -> None:
    engine = EngineConfig(max_batch_size=4)
    settings = Settings.for_model("./rr", name="rr", device="cuda", engine=engine, max_body_bytes=1024)
    assert settings == Settings(models=(ModelSpec("./rr", "rr", device="cuda", engine=engine),), max_body_bytes=1024)
    assert Settings.for_model() == Settings()
    with pytest.raises(ValueError, match=r"^Settings\.for_model serves one model: give several as Settings\(models"):
        Settings.for_model(models=(ModelSpec(),))
    with pytest.raises(TypeError, match="nonsense"):
        Settings.for_model(nonsense=1)


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "1", True])
def test_the_queue_wait_is_off_or_a_positive_number_of_seconds(value: Any) -> None:
    with pytest.raises(ValueError, match=r"EngineConfig\.max_queue_wait must be a number of seconds, more than 0"):
        EngineConfig(max_queue_wait=value)
    assert EngineConfig().max_queue_wait is None
    assert EngineConfig(max_queue_wait=0.25).max_queue_wait == 0.25


@pytest.mark.parametrize("value", [0, 1, -0.5, float("nan"), "0.5", True])
def test_the_batch_efficiency_is_off_or_a_share_between_0_and_1(value: Any) -> None:
    with pytest.raises(ValueError, match=r"EngineConfig\.batch_efficiency must be a number between 0 and 1"):
        EngineConfig(batch_efficiency=value)
    assert EngineConfig(batch_efficiency=None).batch_efficiency is None


def test_the_defaults_and_the_edges_are_accepted() -> None:
    Settings.for_model(shutdown_timeout=0, limit_concurrency=0, kind="causal-lm", engine=EngineConfig(max_batch_size=1))
    assert Settings().models == (ModelSpec(),)


def test_a_model_spec_refuses_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match=r"ModelSpec\.max_model_len must be a whole number, at least 1, not -1"):
        ModelSpec(max_model_len=-1)
