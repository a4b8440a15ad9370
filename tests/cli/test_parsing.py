"""Flags and their SCOREKIT_* variables are checked while parsing: a bad one is one line and exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scorekit.cli import parse
from scorekit.settings import MODEL_KINDS, Settings


@pytest.fixture(autouse=True)
def no_scorekit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SCOREKIT_"):
            monkeypatch.delenv(key)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``argv`` exits 2 with one line on stderr; that line."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("scorekit serve: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-batch-size", "0"),
        ("--max-batch-size", "-3"),
        ("--max-batch-tokens", "0"),
        ("--max-batch-tokens", "automatic"),
        ("--max-queued-items", "0"),
        ("--max-concurrent-requests", "0"),
        ("--max-body-bytes", "0"),
        ("--max-items-per-request", "-1"),
        ("--port", "0"),
        ("--port", "99999"),
        ("--port", "abc"),
        ("--shutdown-timeout", "-1"),
        ("--shutdown-timeout", "nan"),
        ("--shutdown-timeout", "inf"),
        ("--header-timeout", "0"),
        ("--limit-concurrency", "-1"),
        ("--max-batch-size", "1.5"),
        ("--max-model-len", "0"),
        ("--batch-efficiency", "1"),
        ("--batch-efficiency", "-0.5"),
        ("--batch-efficiency", "nan"),
        ("--model-workers", "0"),
        ("--model-workers", "two"),
        ("--small-job-lane", "-1"),
    ],
)
def test_numeric_flags_are_checked_while_parsing(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["serve", flag, value], capsys)
    assert f"argument {flag}:" in line and value in line


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("SCOREKIT_PORT", "abc", "whole number"),
        ("SCOREKIT_PORT", "70000", "from 1 to 65535"),
        ("SCOREKIT_MAX_BATCH_SIZE", "0", "at least 1"),
        ("SCOREKIT_MODEL_KIND", "reranker", "invalid choice: 'reranker'"),
        ("SCOREKIT_DTYPE", "int8", "invalid choice: 'int8'"),
        ("SCOREKIT_DEVICE", "tpu", "unsupported device 'tpu'"),
        ("SCOREKIT_SHUTDOWN_TIMEOUT", "soon", "number of seconds"),
        ("SCOREKIT_DEBUG", "maybe", "1/true/yes/on"),
        ("SCOREKIT_TRUST_REMOTE_CODE", "maybe", "1/true/yes/on"),
        ("SCOREKIT_MAX_MODEL_LEN", "-5", "at least 1"),
    ],
)
def test_variables_go_through_the_same_checks_and_are_named(
    variable: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, value)
    line = refused(["serve"], capsys)
    assert f"environment variable {variable}:" in line and said in line


def test_a_bad_variable_does_not_break_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCOREKIT_PORT", "abc")
    with pytest.raises(SystemExit) as exited:
        parse(["serve", "--help"])
    assert exited.value.code == 0
    assert "--port PORT" in capsys.readouterr().out


def test_variables_fill_what_the_command_line_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOREKIT_PORT", "9001")
    monkeypatch.setenv("SCOREKIT_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("SCOREKIT_DEBUG", "yes")
    monkeypatch.setenv("SCOREKIT_DTYPE", "")  # set but empty: as if unset
    args = parse(["serve", "--max-batch-size", "3"])
    assert (args.port, args.max_batch_size, args.debug, args.dtype) == (9001, 3, True, "auto")


def test_defaults_are_the_settings_defaults() -> None:
    assert parse(["serve"]).settings == Settings()


@pytest.mark.parametrize(
    ("argv", "variable", "tokens"),
    [([], "", None), (["--max-batch-tokens", "auto"], "512", None), ([], "auto", None), ([], "2048", 2048)],
)
def test_max_batch_tokens_is_a_number_or_auto(
    argv: list[str], variable: str, tokens: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto (None) is sized for the device at start-up (models/budget.py); on the command line it wins over the
    variable like any value."""
    monkeypatch.setenv("SCOREKIT_MAX_BATCH_TOKENS", variable)
    specs = parse(["serve", "--model", "a", "--model", "b=c", *argv]).settings.models
    assert [spec.engine.max_batch_tokens for spec in specs] == [tokens, tokens]


def test_model_workers_reach_every_model() -> None:
    specs = parse(["serve", "--model", "a", "--model", "b=c", "--model-workers", "2"]).settings.models
    assert [spec.engine.model_workers for spec in specs] == [2, 2]


def test_max_model_len_and_trust_remote_code_reach_every_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOREKIT_TRUST_REMOTE_CODE", "1")
    specs = parse(["serve", "--model", "a", "--model", "b=c", "--max-model-len", "64"]).settings.models
    assert [(spec.max_model_len, spec.trust_remote_code) for spec in specs] == [(64, True), (64, True)]


def test_several_models_are_named_and_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "a=b"  # an existing path with '=' in it is a plain MODEL
    odd.mkdir()
    args = parse(
        ["serve", "--model", "./rr", "--model", "mini=org/minilm", "--model", str(odd), "--max-batch-size", "4"]
    )
    assert [(spec.served_name, spec.path, spec.engine.max_batch_size) for spec in args.settings.models] == [
        ("./rr", "./rr", 4),
        ("mini", "org/minilm", 4),
        (str(odd), str(odd), 4),
    ]
    two = ["serve", "--model", "a", "--model", "b"]
    assert "--model-kind applies to one model" in refused([*two, "--model-kind", "bi-encoder"], capsys)
    assert "--served-model-name applies to one model" in refused([*two, "--served-model-name", "x"], capsys)
    assert "two models are served as 'x'" in refused(["serve", "--model", "x=a", "--model", "x=b"], capsys)
    assert "needs both a name and a model" in refused(["serve", "--model", "=a"], capsys)
    assert "repeat --model to serve several" in refused(["serve", "a", "--model", "b"], capsys)
    one = parse(["serve", "judge=./lm", "--model-kind", "causal-lm"]).settings.models
    assert [(spec.served_name, spec.path, spec.kind) for spec in one] == [("judge", "./lm", "causal-lm")]


def test_device_and_dtype_are_checked_while_parsing(capsys: pytest.CaptureFixture[str]) -> None:
    assert "invalid choice: 'int8'" in refused(["serve", "--dtype", "int8"], capsys)
    assert "unsupported device 'tpu'" in refused(["serve", "--device", "tpu"], capsys)
    assert "unsupported device 'cuda:x'" in refused(["serve", "--device", "cuda:x"], capsys)
    # Whether CUDA is there is the loader's question (a one-line start-up error); the name is good.
    assert parse(["serve", "--device", "cuda:1", "--dtype", "bfloat16"]).device == "cuda:1"


def test_the_model_may_be_positional(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["serve", "./my-reranker", "--port", "9000"]).model == ["./my-reranker"]
    assert parse(["serve", "--port", "9000", "org/name"]).model == ["org/name"]
    assert parse(["serve", "org/name", "--model", "org/name"]).model == ["org/name"]
    monkeypatch.setenv("SCOREKIT_MODEL", "org/other")
    assert parse(["serve", "org/name"]).model == ["org/name"]  # the command line wins over the variable
    line = refused(["serve", "org/name", "--model", "org/other"], capsys)
    assert "given twice" in line and "'org/name'" in line and "'org/other'" in line
    assert "must not be empty" in refused(["serve", "--model", ""], capsys)


def test_help_lists_choices_examples_and_real_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["serve", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "default: None" not in text
    assert "{auto,float32,float16,bfloat16}" in text
    assert "{" + ",".join(MODEL_KINDS) + "}" in text  # every kind, the listwise reranker's too
    assert {"cross-encoder", "bi-encoder", "causal-lm", "llm-reranker", "listwise-reranker"} <= set(MODEL_KINDS)
    assert "cpu, cuda or cuda:N" in text
    assert "examples:" in text and text.count("scorekit serve ") >= 4
    assert "SCOREKIT_MAX_BATCH_SIZE" in text and "[MODEL]" in text
