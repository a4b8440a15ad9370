"""``--max-queue-wait`` / ``SCOREKIT_MAX_QUEUE_WAIT``: off by default, a positive number of seconds, checked
while parsing like the other numeric flags, and carried into every model's EngineConfig."""

from __future__ import annotations

import pytest

from scorekit.cli import parse

# The autouse fixture that clears SCOREKIT_* variables applies here once imported; `refused` checks one line, exit 2.
from tests.cli.test_parsing import no_scorekit_env, refused  # noqa: F401


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_value_is_one_line_and_exit_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["serve", "--max-queue-wait", value], capsys)
    assert "argument --max-queue-wait: expected a number of seconds above 0" in line and value in line


def test_the_variable_goes_through_the_same_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCOREKIT_MAX_QUEUE_WAIT", "0")
    line = refused(["serve"], capsys)
    assert "environment variable SCOREKIT_MAX_QUEUE_WAIT: expected a number of seconds above 0" in line


def test_off_by_default_and_given_to_every_model(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(spec.engine.max_queue_wait is None for spec in parse(["serve"]).settings.models)
    two = parse(["serve", "--model", "a=x", "--model", "b=y", "--max-queue-wait", "2.5"])
    assert [spec.engine.max_queue_wait for spec in two.settings.models] == [2.5, 2.5]
    monkeypatch.setenv("SCOREKIT_MAX_QUEUE_WAIT", "0.75")
    assert parse(["serve"]).settings.models[0].engine.max_queue_wait == 0.75
    assert parse(["serve", "--max-queue-wait", "3"]).settings.models[0].engine.max_queue_wait == 3.0  # the flag wins


def test_help_shows_it_off(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--max-queue-wait SECONDS" in out and "SCOREKIT_MAX_QUEUE_WAIT; default: off" in out
