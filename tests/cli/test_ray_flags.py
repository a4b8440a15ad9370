"""`scorekit serve --ray` and its Ray Serve flags: parsed into RayOptions, and every combination that Ray would
refuse or silently ignore is one line and exit 2 before anything starts. No Ray is started here."""

from __future__ import annotations

import importlib.util
import os
from importlib.machinery import ModuleSpec

import pytest

from scorekit.cli import parse
from scorekit.deploy.options import Autoscaling, RayOptions

from .test_parsing import refused


@pytest.fixture(autouse=True)
def no_scorekit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SCOREKIT_"):
            monkeypatch.delenv(key)


@pytest.fixture
def ray_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing asks only whether Ray is importable: answer yes, whether the extra is installed or not."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return ModuleSpec("ray", None) if name == "ray" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_without_the_extra_ray_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None if name == "ray" else real(name))
    line = refused(["serve", "--ray"], capsys)
    assert "--ray needs Ray Serve, which is not installed: pip install 'scorekit[ray]'" in line


@pytest.mark.usefixtures("ray_installed")
def test_the_flags_become_ray_options() -> None:
    args = parse(["serve", "--ray", "--replicas", "3", "--num-cpus", "2", "--replica-probe-port", "9100"])
    assert args.ray_options == RayOptions(replicas=3, num_cpus=2, probe_port=9100)
    args = parse(["serve", "--ray", "--max-replicas", "8", "--target-ongoing-requests", "64", "--host", "0.0.0.0"])
    assert args.ray_options == RayOptions(autoscaling=Autoscaling(1, 8, 64), probe_host="0.0.0.0")
    assert parse(["serve", "--ray", "--device", "cuda", "--num-gpus", "1"]).ray_options.num_gpus == 1


@pytest.mark.usefixtures("ray_installed")
def test_the_variables_work_as_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOREKIT_RAY", "1")
    monkeypatch.setenv("SCOREKIT_MAX_REPLICAS", "4")
    monkeypatch.setenv("SCOREKIT_MIN_REPLICAS", "0")
    assert parse(["serve"]).ray_options == RayOptions(autoscaling=Autoscaling(0, 4))


def test_without_ray_there_are_no_ray_options() -> None:
    assert parse(["serve"]).ray_options is None


@pytest.mark.usefixtures("ray_installed")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "2"], "--replicas applies to Ray Serve only: add --ray"),
        (["--replica-probe-port", "9100"], "--replica-probe-port applies to Ray Serve only: add --ray"),
        (["--ray", "--num-gpus", "1"], "--num-gpus gives each replica a GPU: add --device cuda"),
        (["--ray", "--device", "cuda:1"], "--device cuda:N picks one GPU, but Ray gives each replica its own"),
        (["--ray", "--min-replicas", "2"], "--min-replicas autoscales: add --max-replicas"),
        (
            ["--ray", "--replicas", "2", "--max-replicas", "4"],
            "--replicas is a fixed count and --max-replicas autoscales",
        ),
        (["--ray", "--min-replicas", "5", "--max-replicas", "4"], "--min-replicas (5) is above --max-replicas (4)"),
        (["--ray", "--header-timeout", "3"], "--header-timeout limits scorekit's own server"),
        (["--ray", "--limit-concurrency", "100"], "--limit-concurrency limits scorekit's own server"),
        (
            ["--ray", "--max-replicas", "4", "--target-ongoing-requests", "600"],
            "--target-ongoing-requests (600) must be below --max-ongoing-requests (512",
        ),
        (
            ["--ray", "--max-replicas", "2", "--max-concurrent-requests", "1"],
            "--target-ongoing-requests (1) must be below --max-ongoing-requests (1",
        ),
        (["--ray", "--num-cpus", "-1"], "argument --num-cpus: expected a number, 0 or more, not '-1'"),
    ],
)
def test_bad_combinations_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in refused(["serve", *argv], capsys)
