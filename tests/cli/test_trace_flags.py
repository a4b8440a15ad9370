"""The trace flags: --otlp-traces-endpoint (and TEI's --otlp-endpoint), --otlp-traces-protocol and
--otlp-service-name fill the settings, their SCOREKIT_* variables too; a bad URL, a bad OTEL_* variable and a
missing otel extra are each one line and exit 2, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scorekit.cli import parse
from scorekit.settings import Settings
from scorekit.tracing import INSTALL_HINT, TraceConfig
from tests.cli.conftest import ROOT, one_line_error
from tests.cli.test_parsing import refused

URL = "http://collector:4317"


@pytest.fixture(autouse=True)
def no_scorekit_or_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("SCOREKIT_", "OTEL_")):
            monkeypatch.delenv(key)


def settings(*argv: str) -> Settings:
    parsed: Settings = parse(["serve", *argv]).settings
    return parsed


def test_no_trace_flag_leaves_traces_off() -> None:
    given = settings()
    assert (given.otlp_traces_endpoint, given.otlp_traces_protocol, given.otlp_service_name) == (None, None, None)
    assert TraceConfig.resolve(given, {}) is None


@pytest.mark.parametrize("flag", ["--otlp-traces-endpoint", "--otlp-endpoint"])
def test_the_endpoint_flag_and_teis_alias_fill_the_one_setting(flag: str) -> None:
    assert settings(flag, URL).otlp_traces_endpoint == URL
    assert settings(flag, f"  {URL} ").otlp_traces_endpoint == URL


def test_the_endpoint_variable_fills_the_setting_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCOREKIT_OTLP_TRACES_ENDPOINT", URL)
    assert settings().otlp_traces_endpoint == URL
    assert settings("--otlp-endpoint", "https://other:4317").otlp_traces_endpoint == "https://other:4317"


@pytest.mark.parametrize("flag", ["--otlp-traces-endpoint", "--otlp-endpoint"])
@pytest.mark.parametrize("url", ["ftp://collector:4317", "localhost:4317", "http://"])
def test_a_bad_endpoint_flag_is_one_line_naming_the_flag(
    flag: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["serve", flag, url], capsys)
    assert "argument --otlp-traces-endpoint/--otlp-endpoint: expected the collector's http:// or https:// URL" in line
    assert repr(url) in line


@pytest.mark.parametrize(
    ("variable", "said"),
    [
        (
            "SCOREKIT_OTLP_TRACES_ENDPOINT",
            "environment variable SCOREKIT_OTLP_TRACES_ENDPOINT: expected the collector's http://",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: expected the collector's http:// or https:// URL",
        ),
    ],
)
def test_a_bad_endpoint_variable_is_one_line_naming_it(
    variable: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, "localhost:4317")
    assert said in refused(["serve"], capsys)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_protocol_flag_takes_its_two_choices(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings("--otlp-endpoint", URL, "--otlp-traces-protocol", protocol).otlp_traces_protocol == protocol
    monkeypatch.setenv("SCOREKIT_OTLP_TRACES_PROTOCOL", protocol)
    assert settings("--otlp-endpoint", URL).otlp_traces_protocol == protocol


@pytest.mark.parametrize("protocol", ["http/json", "http", "GRPC"])
def test_the_protocol_flag_refuses_anything_else(protocol: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["serve", "--otlp-traces-protocol", protocol], capsys)
    assert f"argument --otlp-traces-protocol: invalid choice: '{protocol}'" in line


def test_a_bad_otel_protocol_variable_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    line = refused(["serve", "--otlp-endpoint", URL], capsys)
    assert line.startswith("scorekit serve: error: OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf")


def test_the_service_name_flag_and_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert settings("--otlp-service-name", "ranker").otlp_service_name == "ranker"
    monkeypatch.setenv("SCOREKIT_OTLP_SERVICE_NAME", "judge")
    assert settings().otlp_service_name == "judge"
    assert settings("--otlp-service-name", "ranker").otlp_service_name == "ranker"
    assert "argument --otlp-service-name:" in refused(["serve", "--otlp-service-name", " "], capsys)


def test_the_flags_fill_the_trace_config() -> None:
    given = settings(
        "--otlp-endpoint",
        "http://collector:4318",
        "--otlp-traces-protocol",
        "http/protobuf",
        "--otlp-service-name",
        "rk",
    )
    assert TraceConfig.resolve(given, {}) == TraceConfig("http://collector:4318/v1/traces", "http/protobuf", "rk")


def test_help_lists_the_trace_flags_and_the_alias(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["serve", "--help"])
    assert exited.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes
    for name in ("--otlp-traces-endpoint URL, --otlp-endpoint URL", "--otlp-traces-protocol", "--otlp-service-name"):
        assert name in shown, name
    assert "{grpc,http/protobuf}" in shown
    assert "env SCOREKIT_OTLP_TRACES_ENDPOINT" in shown


# `scorekit serve` in an interpreter where no opentelemetry module can be imported (the otel extra missing): a meta
# path finder refuses them all, as a missing distribution would.
WITHOUT_OTEL = """
import sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
from scorekit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def serve_without_otel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("SCOREKIT_", "OTEL_"))}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, "serve", *args],
        cwd=ROOT,
        env={**clean, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


MISSING = "/no/such/model/folder"  # what serve would say next, at once, had the missing extra not been said first


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--otlp-traces-endpoint", URL), {}),
        ((), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": URL}),
    ],
)
def test_traces_without_the_otel_extra_are_one_line_and_exit_2(args: tuple[str, ...], env: dict[str, str]) -> None:
    line = one_line_error(serve_without_otel(MISSING, *args, env=env), 2)
    assert line.startswith("scorekit serve: error: traces need OpenTelemetry's SDK and exporters: ")
    assert INSTALL_HINT in line and INSTALL_HINT == "pip install 'scorekit[otel]'"


def test_without_traces_the_missing_extra_is_no_error() -> None:
    """The control: the same interpreter with no trace asked for gets past the flags, to the missing folder."""
    line = one_line_error(serve_without_otel(MISSING), 1)
    assert "no such folder" in line and "otel" not in line
