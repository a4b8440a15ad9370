"""``--model-host`` / ``SCOREKIT_MODEL_HOST``: thread by default, process on asking, carried into every model's
ModelSpec; a value it does not know, and process under ``--ray``, are one line and exit 2."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

import pytest

from scorekit.cli import parse
from scorekit.settings import ModelSpec

# The autouse fixture that clears SCOREKIT_* variables applies here once imported; `refused` checks one line, exit 2.
from tests.cli.test_parsing import no_scorekit_env, refused  # noqa: F401


def test_thread_by_default_and_given_to_every_model(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [spec.host for spec in parse(["serve"]).settings.models] == ["thread"]
    two = parse(["serve", "--model", "a=x", "--model", "b=y", "--model-host", "process"])
    assert [spec.host for spec in two.settings.models] == ["process", "process"]
    monkeypatch.setenv("SCOREKIT_MODEL_HOST", "process")
    assert parse(["serve"]).settings.models[0].host == "process"
    assert parse(["serve", "--model-host", "thread"]).settings.models[0].host == "thread"  # the flag wins


def test_a_bad_value_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "argument --model-host: invalid choice: 'fork'" in refused(["serve", "--model-host", "fork"], capsys)
    monkeypatch.setenv("SCOREKIT_MODEL_HOST", "fork")
    assert "SCOREKIT_MODEL_HOST" in refused(["serve"], capsys)
    with pytest.raises(ValueError, match=r"ModelSpec\.host must be one of thread, process, not 'fork'"):
        ModelSpec(host="fork")  # type: ignore[arg-type]


def test_process_under_ray_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, package=None: ModuleSpec("ray", None) if name == "ray" else real(name)
    )
    line = refused(["serve", "--ray", "--model-host", "process"], capsys)
    assert "--model-host process does not run under --ray yet" in line
    assert parse(["serve", "--ray", "--model-host", "thread"]).ray_options is not None
