"""``--api-processes N|auto`` / ``SCOREKIT_API_PROCESSES``: 1 by default (one process, models hosted as asked);
more than 1 hosts every model in a process; auto is 1 on a CPU and a quarter of the cores (2 to 8) beside a GPU;
1 to 64 accepted (the load board's rows), anything else, ``--model-host thread`` beside N > 1, and N > 1 under
``--ray`` are one line and exit 2."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

import pytest

from scorekit.cli import parse
from scorekit.load import ROWS

# The autouse fixture that clears SCOREKIT_* variables applies here once imported; `refused` checks one line, exit 2.
from tests.cli.test_parsing import no_scorekit_env, refused  # noqa: F401


def test_one_by_default_and_more_hosts_every_model_in_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    one = parse(["serve", "--model", "a=x", "--model", "b=y"])
    assert one.api_processes == 1 and [spec.host for spec in one.settings.models] == ["thread", "thread"]
    two = parse(["serve", "--model", "a=x", "--model", "b=y", "--api-processes", "2"])
    assert two.api_processes == 2 and [spec.host for spec in two.settings.models] == ["process", "process"]
    assert parse(["serve", "--api-processes", "2", "--model-host", "process"]).api_processes == 2
    monkeypatch.setenv("SCOREKIT_API_PROCESSES", "3")
    assert parse(["serve"]).api_processes == 3
    assert parse(["serve", "--api-processes", "1"]).api_processes == 1  # the flag wins


def test_the_limit_is_the_board_s_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["serve", "--api-processes", str(ROWS)]).api_processes == ROWS
    line = refused(["serve", "--api-processes", str(ROWS + 1)], capsys)
    assert f"argument --api-processes: must be from 1 to {ROWS}, not {ROWS + 1} (or auto)" in line
    assert "must be from 1" in refused(["serve", "--api-processes", "0"], capsys)
    assert "expected a whole number" in refused(["serve", "--api-processes", "two"], capsys)


def test_auto_is_one_on_a_cpu_and_a_quarter_of_the_cores_beside_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse(["serve", "--api-processes", "auto"]).api_processes == 1
    for cores, expected in ((1, 2), (8, 2), (12, 3), (16, 4), (64, 8)):
        monkeypatch.setattr("os.cpu_count", lambda cores=cores: cores)
        args = parse(["serve", "--api-processes", "auto", "--device", "cuda"])
        assert args.api_processes == expected, cores
        assert args.settings.models[0].host == "process"


def test_thread_beside_several_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["serve", "--api-processes", "2", "--model-host", "thread"], capsys)
    assert "--api-processes 2 feeds every model from a model host process: leave out --model-host thread" in line
    monkeypatch.setenv("SCOREKIT_MODEL_HOST", "thread")
    assert "leave out --model-host thread" in refused(["serve", "--api-processes", "2"], capsys)


def test_several_under_ray_are_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, package=None: ModuleSpec("ray", None) if name == "ray" else real(name)
    )
    for value in ("2", "auto"):
        line = refused(["serve", "--ray", "--api-processes", value], capsys)
        assert "--api-processes applies without --ray: Ray Serve runs replicas of its own (--replicas)" in line
    assert parse(["serve", "--ray", "--api-processes", "1"]).ray_options is not None
