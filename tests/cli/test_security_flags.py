"""--api-key, --api-key-file and the CORS flags: parsed into Settings, a bad one is one line and exit 2, and
--help shows no key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scorekit.cli import parse
from scorekit.settings import Settings
from tests.cli.test_parsing import refused


@pytest.fixture(autouse=True)
def no_scorekit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SCOREKIT_"):
            monkeypatch.delenv(key)


def test_keys_come_from_flags_a_variable_and_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\n\n  k3  \nk1\n# k9\nk4\n")
    settings = parse(["serve", "--api-key", "k1", "--api-key", "k2", "--api-key-file", str(keys)]).settings
    assert settings.api_keys == ("k1", "k2", "k3", "k4")
    monkeypatch.setenv("SCOREKIT_API_KEY", "from-env")
    assert parse(["serve"]).settings.api_keys == ("from-env",)
    assert parse(["serve", "--api-key", "k1"]).settings.api_keys == ("k1",)  # the command line wins
    monkeypatch.setenv("SCOREKIT_API_KEY_FILE", str(keys))
    assert parse(["serve"]).settings.api_keys == ("from-env", "k3", "k1", "k4")


def test_a_bad_key_file_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n# only a comment\n")
    assert "holds no key" in refused(["serve", "--api-key-file", str(empty)], capsys)
    assert "cannot read" in refused(["serve", "--api-key-file", str(tmp_path / "missing")], capsys)
    assert "cannot read" in refused(["serve", "--api-key-file", str(tmp_path)], capsys)
    monkeypatch.setenv("SCOREKIT_API_KEY_FILE", str(empty))
    assert "SCOREKIT_API_KEY_FILE" in refused(["serve"], capsys)


def test_cors_flags_take_a_json_list_or_commas(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["serve", "--allowed-origins", '["https://a.example", "https://b.example"]', "--allowed-methods", "GET,POST"]
    settings = parse([*args, "--allowed-headers", "content-type, authorization", "--allow-credentials"]).settings
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.allowed_methods == ("GET", "POST")
    assert settings.allowed_headers == ("content-type", "authorization")
    assert settings.allow_credentials is True
    monkeypatch.setenv("SCOREKIT_ALLOWED_ORIGINS", "*")
    monkeypatch.setenv("SCOREKIT_ALLOW_CREDENTIALS", "no")
    settings = parse(["serve"]).settings
    assert (settings.allowed_origins, settings.allow_credentials) == (("*",), False)
    for bad in ('["https://a.example", 3]', "[not json", "a,,b"):
        assert "argument --allowed-origins:" in refused(["serve", "--allowed-origins", bad], capsys)


def test_the_defaults_ask_no_key_and_serve_no_cors() -> None:
    settings = parse(["serve"]).settings
    defaults = Settings()
    assert (settings.api_keys, settings.allowed_origins) == ((), ())
    assert (settings.allowed_methods, settings.allowed_headers) == (defaults.allowed_methods, defaults.allowed_headers)


def test_help_shows_no_key(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SCOREKIT_API_KEY", "secret-from-env")
    with pytest.raises(SystemExit):
        parse(["serve", "--api-key", "secret-on-line", "--help"])
    text = capsys.readouterr().out
    assert "--api-key KEY" in text and "--api-key-file PATH" in text and "--allowed-origins ORIGINS" in text
    assert "secret" not in text


def test_an_empty_key_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --api-key: must not be empty" in refused(["serve", "--api-key", " "], capsys)
    with pytest.raises(ValueError, match="api_keys"):
        Settings(api_keys=("k1", ""))
