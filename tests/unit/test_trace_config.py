"""How traces are configured (``tracing.TraceConfig.resolve`` over the settings and the ``OTEL_*`` variables), that
they cost nothing while off, and what a traced job's batches carry: the worker's notes and the model host's wire.

The spans themselves, exported to a real collector, are tests/e2e/test_traces.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from scorekit import __version__
from scorekit.app import create_app
from scorekit.cli.front_end import Assignment, _receive_assignment, send_assignment
from scorekit.errors import ModelFailure
from scorekit.host import wire
from scorekit.jobs import BatchRun, Job, WorkItem
from scorekit.middleware.tracing import Traces
from scorekit.models.base import Encoded, token_array
from scorekit.settings import Settings
from scorekit.tracing import TraceConfig, check_endpoint, exporter_endpoint
from scorekit.worker import ModelWorker
from tests.unit.test_worker import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]
GRPC = "http://collector:4317"
HTTP = "http://collector:4318"
ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app reads the process's variables: none of the machine's may leak into a test."""
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def resolve(environ: Mapping[str, str] | None = None, **settings: Any) -> TraceConfig | None:
    return TraceConfig.resolve(Settings(**settings), environ or {})


def on(environ: Mapping[str, str] | None = None, **settings: Any) -> TraceConfig:
    config = resolve(environ, **settings)
    assert config is not None, "traces are off"
    return config


def layers(app: object) -> list[type]:
    """The app's middleware stack, outermost first, down to the router."""
    found: list[type] = []
    layer = getattr(app, "_stack", None)
    while layer is not None:
        found.append(type(layer))
        layer = getattr(layer, "app", None)
    return found


# -- off by default, and then free -----------------------------------------------------------------------------------


def test_traces_are_off_by_default_and_the_app_has_no_traces_layer() -> None:
    assert resolve() is None
    app = create_app(Settings())
    assert app.tracing is None
    stack = layers(app)
    assert len(stack) > 4 and Traces not in stack, stack


def test_traces_on_put_the_traces_layer_in_the_stack() -> None:
    """The check above can see the layer: with an endpoint it is there."""
    app = create_app(Settings(otlp_traces_endpoint=GRPC))
    assert app.tracing is not None
    try:
        assert Traces in layers(app)
    finally:
        app.tracing.provider.shutdown()


# A fresh interpreter with tracing off imports the app, creates it and answers GET /health straight through the ASGI
# app (no lifespan: nothing loads), then lists the opentelemetry modules loaded; then, as a control that the listing
# sees them, does the same with an endpoint.
NO_OTEL_PROBE = """
import sys
import anyio
from scorekit.app import create_app
from scorekit.settings import Settings

def loaded():
    return sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")

def get(app, path):
    sent, delivered = [], False
    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()
    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"", "root_path": ""}
    anyio.run(app, scope, receive, send)
    return sent[0]["status"]

app = create_app(Settings())
print(app.tracing, get(app, "/health"), loaded())
traced = create_app(Settings(otlp_traces_endpoint="http://127.0.0.1:9"))
print(type(traced.tracing).__name__, get(traced, "/health"), bool(loaded()))
traced.tracing.provider.shutdown()
"""


def test_with_traces_off_the_app_imports_no_opentelemetry() -> None:
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "SCOREKIT_"))}
    probe = subprocess.run(
        [sys.executable, "-c", NO_OTEL_PROBE],
        cwd=ROOT,
        env={**clean, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    off, control = probe.stdout.strip().splitlines()[-2:]
    assert off == "None 503 []", off  # the app answered (not ready: no lifespan) with no opentelemetry module
    assert control == "Tracing 503 True", control


# -- the endpoint: the setting, else the traces' own variable ---------------------------------------------------------


def test_the_setting_wins_over_the_variable() -> None:
    assert on({ENDPOINT: "http://elsewhere:4317"}, otlp_traces_endpoint=GRPC).endpoint == GRPC


def test_the_traces_variable_alone_turns_traces_on() -> None:
    config = on({ENDPOINT: f" {GRPC} "})
    assert config == TraceConfig(GRPC, "grpc", "scorekit")


def test_the_general_otlp_endpoint_alone_does_not_turn_traces_on() -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT is every signal's, set for other programs too: no request for scorekit's traces."""
    assert resolve({"OTEL_EXPORTER_OTLP_ENDPOINT": GRPC}) is None
    assert resolve({ENDPOINT: "  "}) is None


@pytest.mark.parametrize("value", ["true", "TRUE", " True ", "tRuE\n"])
def test_otel_sdk_disabled_turns_traces_off_even_with_the_setting(value: str) -> None:
    disabled = {"OTEL_SDK_DISABLED": value}
    assert resolve(disabled, otlp_traces_endpoint=GRPC) is None
    assert resolve({**disabled, ENDPOINT: GRPC}) is None


@pytest.mark.parametrize("value", ["false", "False", "", "0", "no"])
def test_otel_sdk_disabled_other_than_true_leaves_traces_on(value: str) -> None:
    assert on({"OTEL_SDK_DISABLED": value}, otlp_traces_endpoint=GRPC).endpoint == GRPC
    assert on({"OTEL_SDK_DISABLED": value, ENDPOINT: GRPC}).endpoint == GRPC


# -- the protocol ------------------------------------------------------------------------------------------------------


TRACES_PROTOCOL, GENERAL_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"


def test_the_protocol_is_grpc_by_default() -> None:
    assert on(otlp_traces_endpoint=GRPC).protocol == "grpc"


def test_the_protocol_setting_wins_over_both_variables() -> None:
    both = {TRACES_PROTOCOL: "grpc", GENERAL_PROTOCOL: "grpc"}
    assert on(both, otlp_traces_endpoint=HTTP, otlp_traces_protocol="http/protobuf").protocol == "http/protobuf"
    assert on(otlp_traces_endpoint=HTTP, otlp_traces_protocol="http/protobuf").protocol == "http/protobuf"
    # Nor is a variable the setting overrides read at all: its bad value is no error.
    bad = {TRACES_PROTOCOL: "http/json"}
    assert on(bad, otlp_traces_endpoint=GRPC, otlp_traces_protocol="grpc").protocol == "grpc"


def test_the_traces_protocol_variable_wins_over_the_general_one() -> None:
    environ = {ENDPOINT: HTTP, TRACES_PROTOCOL: "http/protobuf", GENERAL_PROTOCOL: "grpc"}
    assert on(environ).protocol == "http/protobuf"
    assert on({ENDPOINT: HTTP, TRACES_PROTOCOL: "grpc", GENERAL_PROTOCOL: "http/protobuf"}).protocol == "grpc"


def test_the_general_protocol_variable_applies_when_the_traces_one_is_unset_or_blank() -> None:
    assert on({ENDPOINT: HTTP, GENERAL_PROTOCOL: " http/protobuf "}).protocol == "http/protobuf"
    assert on({ENDPOINT: HTTP, TRACES_PROTOCOL: " ", GENERAL_PROTOCOL: "http/protobuf"}).protocol == "http/protobuf"


@pytest.mark.parametrize("variable", [TRACES_PROTOCOL, GENERAL_PROTOCOL])
@pytest.mark.parametrize("value", ["http/json", "http", "GRPC", "protobuf"])
def test_a_bad_protocol_variable_is_one_error_naming_it(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=rf"^{variable} must be grpc or http/protobuf, not '{value}'$"):
        resolve({ENDPOINT: GRPC, variable: value})
    with pytest.raises(ValueError, match=rf"^{variable} must be"):
        resolve({variable: value}, otlp_traces_endpoint=GRPC)


def test_a_bad_protocol_variable_is_no_error_while_traces_are_off() -> None:
    assert resolve({TRACES_PROTOCOL: "http/json"}) is None


@pytest.mark.parametrize("value", ["http/json", "http", "", "GRPC"])
def test_the_protocol_setting_refuses_a_bad_value(value: str) -> None:
    with pytest.raises(ValueError, match=r"^Settings\.otlp_traces_protocol must be one of grpc, http/protobuf"):
        Settings(otlp_traces_protocol=value)  # type: ignore[arg-type]


# -- the service name --------------------------------------------------------------------------------------------------


def test_the_service_name_setting_wins_over_otel_service_name() -> None:
    assert on({"OTEL_SERVICE_NAME": "theirs"}, otlp_traces_endpoint=GRPC, otlp_service_name="ours").service_name == (
        "ours"
    )


def test_otel_service_name_applies_without_the_setting() -> None:
    assert on({"OTEL_SERVICE_NAME": " theirs "}, otlp_traces_endpoint=GRPC).service_name == "theirs"


@pytest.mark.parametrize("environ", [{}, {"OTEL_SERVICE_NAME": "  "}])
def test_the_service_name_is_scorekit_by_default(environ: dict[str, str]) -> None:
    assert on(environ, otlp_traces_endpoint=GRPC).service_name == "scorekit"


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_a_blank_service_name_setting_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"^Settings\.otlp_service_name must not be empty$"):
        Settings(otlp_service_name=value)


def test_the_exported_resource_carries_the_service_name_and_version() -> None:
    app = create_app(Settings(otlp_traces_endpoint=GRPC, otlp_service_name="ranker"))
    assert app.tracing is not None
    try:
        attributes = app.tracing.provider.resource.attributes
        assert (attributes["service.name"], attributes["service.version"]) == ("ranker", __version__)
    finally:
        app.tracing.provider.shutdown()


def test_the_exported_resource_takes_otel_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "theirs")
    app = create_app(Settings(otlp_traces_endpoint=GRPC))
    assert app.tracing is not None
    try:
        assert app.tracing.provider.resource.attributes["service.name"] == "theirs"
    finally:
        app.tracing.provider.shutdown()


# -- the endpoint's URL ------------------------------------------------------------------------------------------------


GOOD_URLS = [
    "http://collector:4317",
    "https://collector.example",
    "http://127.0.0.1:4318/v1/traces",
    "http://[::1]:4317",
]
BAD_URLS = ["ftp://collector:4317", "localhost:4317", "http://", "collector", "https://:4317", "file:///tmp/x"]


@pytest.mark.parametrize("url", GOOD_URLS)
def test_an_http_or_https_url_with_a_host_is_accepted(url: str) -> None:
    assert check_endpoint(url) == url
    assert Settings(otlp_traces_endpoint=url).otlp_traces_endpoint == url
    assert on({ENDPOINT: url}).endpoint == url


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_without_http_or_a_host_is_refused_by_the_settings(url: str) -> None:
    with pytest.raises(ValueError, match=r"^Settings\.otlp_traces_endpoint: expected the collector's http://"):
        Settings(otlp_traces_endpoint=url)


@pytest.mark.parametrize("url", [" http://h:4317", "http://h:4317 ", "http://h:4317\n"])
def test_a_url_with_spaces_around_it_is_refused_by_the_settings(url: str) -> None:
    """The flag and the variable strip what they are given; code that builds the settings gets told."""
    with pytest.raises(ValueError, match=r"^Settings\.otlp_traces_endpoint: expected the collector's http://"):
        Settings(otlp_traces_endpoint=url)
    assert on({ENDPOINT: url}).endpoint == url.strip()


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_without_http_or_a_host_is_refused_from_the_variable_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match=rf"^{ENDPOINT}: expected the collector's http:// or https:// URL, not "):
        resolve({ENDPOINT: url})


@pytest.mark.parametrize(
    ("given", "posted"),
    [
        ("http://h:4318", "http://h:4318/v1/traces"),
        ("http://h:4318/", "http://h:4318/v1/traces"),
        ("https://h", "https://h/v1/traces"),
        ("http://h:4318/v1/traces", "http://h:4318/v1/traces"),
        ("http://h:4318/otlp/v1/traces", "http://h:4318/otlp/v1/traces"),
        ("http://h:4318/custom/", "http://h:4318/custom/"),
        ("http://h:4318?tenant=a", "http://h:4318/v1/traces?tenant=a"),  # the path before the query
    ],
)
def test_an_http_endpoint_without_a_path_gets_the_traces_path_once(given: str, posted: str) -> None:
    assert exporter_endpoint(given, "http/protobuf") == posted
    assert on(otlp_traces_endpoint=given, otlp_traces_protocol="http/protobuf").endpoint == posted
    assert on({ENDPOINT: given, TRACES_PROTOCOL: "http/protobuf"}).endpoint == posted


@pytest.mark.parametrize("given", ["http://h:4317", "http://h:4317/", "https://h/prefix"])
def test_grpc_never_changes_the_url(given: str) -> None:
    assert exporter_endpoint(given, "grpc") == given
    assert on(otlp_traces_endpoint=given).endpoint == given


# -- settings with traces cross to the front-end processes -------------------------------------------------------------


def test_the_trace_settings_cross_to_a_front_end_in_its_assignment() -> None:
    import socket

    settings = Settings(otlp_traces_endpoint=HTTP, otlp_traces_protocol="http/protobuf", otlp_service_name="ranker")
    assignment = Assignment(settings, 1, "/run", {"model": "/run/host-0.sock"}, "127.0.0.1", 8000, "info")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        send_assignment(ours, assignment)
        got = _receive_assignment(theirs)
    assert got is not None and got.settings == settings
    assert (got.settings.otlp_traces_endpoint, got.settings.otlp_traces_protocol, got.settings.otlp_service_name) == (
        HTTP,
        "http/protobuf",
        "ranker",
    )
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(Settings()), type=Settings) == Settings()


# -- the worker's notes of a traced job's batches ---------------------------------------------------------------------


REF_A, REF_C = bytes(range(24)), bytes(range(100, 124))


TracedJob = Job[Encoded, torch.Tensor]
Batch = list[WorkItem[Encoded, torch.Tensor]]


def run_one_batch(build: Callable[[], tuple[list[TracedJob], Batch]]) -> tuple[ModelWorker, list[TracedJob]]:
    """``build()`` gives the jobs and the one batch (its items in that order) a real worker runs on the scripted
    backend; the worker and the jobs once every job has its answer."""
    jobs, batch = build()
    left = threading.Semaphore(0)
    for job in jobs:
        job.notify = left.release
    feed: Iterator[Batch] = iter([batch])
    worker = ModelWorker(
        ScriptedBackend(),  # type: ignore[arg-type]
        next_batch=lambda: next(feed, None),
        close=lambda: None,
        on_death=lambda _: None,
    )
    worker.start()
    for _ in jobs:
        assert left.acquire(timeout=10), "a job got no answer"
    worker.join(10)
    assert worker.death is None, worker.death
    return worker, jobs


def three_jobs(first_cost: int = 3) -> tuple[list[TracedJob], Batch]:
    """Traced A (two items), untraced B (one), traced C (one), one batch: A0 B0 C0 A1."""

    def job(costs: list[int], trace: bytes | None) -> TracedJob:
        return Job([Encoded(token_array([0] * n)) for n in costs], notify=lambda: None, trace=trace)

    a, b, c = job([first_cost, 5], REF_A), job([2], None), job([4], REF_C)
    return [a, b, c], [WorkItem(a, 0), WorkItem(b, 0), WorkItem(c, 0), WorkItem(a, 1)]


def test_a_batch_is_noted_on_each_traced_job_in_it_and_not_on_the_untraced_one() -> None:
    before = time.time_ns()
    _, (a, b, c) = run_one_batch(three_jobs)
    after = time.time_ns()
    assert [float(x) for x in a.results if x is not None] == [3.0, 5.0] and b.error is None and c.error is None
    assert b.runs == []
    assert len(a.runs) == 1 and len(c.runs) == 1
    run_a, run_c = a.runs[0], c.runs[0]
    assert run_a == BatchRun(run_a.started_ns, run_a.ended_ns, 4, 5 * 4, 2, (REF_A, REF_C), failed=False)
    assert run_c == BatchRun(run_a.started_ns, run_a.ended_ns, 4, 5 * 4, 1, (REF_A, REF_C), failed=False)
    assert before <= run_a.started_ns <= run_a.ended_ns <= after


def test_the_peers_are_in_order_of_appearance_in_the_batch() -> None:
    def c_first() -> tuple[list[TracedJob], Batch]:
        jobs, batch = three_jobs()
        return jobs, [batch[2], batch[1], batch[0], batch[3]]

    _, (a, _, c) = run_one_batch(c_first)
    assert a.runs[0].peers == c.runs[0].peers == (REF_C, REF_A)


def test_a_failed_batch_is_noted_as_failed_on_each_traced_job() -> None:
    _, (a, b, c) = run_one_batch(lambda: three_jobs(first_cost=13))  # ScriptedBackend fails a batch holding a 13
    assert all(isinstance(job.error, ModelFailure) for job in (a, b, c))
    assert b.runs == []
    assert [(run.items, run.padded_tokens, run.own_items, run.peers, run.failed) for run in (*a.runs, *c.runs)] == [
        (4, 13 * 4, 2, (REF_A, REF_C), True),
        (4, 13 * 4, 1, (REF_A, REF_C), True),
    ]


class _NoWallClock:
    """``time`` for the worker, but for ``time_ns``: a batch of untraced jobs must not read the wall clock."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def time_ns() -> int:
        raise AssertionError("the worker read the wall clock for a batch with no traced job")


def test_a_batch_with_no_traced_job_reads_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scorekit.worker.time", _NoWallClock())

    def untraced() -> tuple[list[TracedJob], Batch]:
        jobs, batch = three_jobs()
        for job in jobs:
            job.trace = None
        return jobs, batch

    worker, jobs = run_one_batch(untraced)
    assert all(job.error is None and job.runs == [] for job in jobs)
    assert worker.stats.batches == 1 and worker.stats.items == 4


# -- the model host's wire: a traced job's span goes out, its batches come back ----------------------------------------


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(wire.Message)


def round_trip(message: wire.Message) -> wire.Message:
    return _DECODER.decode(bytearray(_ENCODER.encode(message)))


def test_a_submits_trace_crosses_the_wire() -> None:
    inputs = [Encoded(token_array([1, 2, 3]))]
    traced = round_trip(wire.submit(7, inputs, trace=REF_A))
    assert isinstance(traced, wire.Submit) and traced.trace == REF_A
    untraced = round_trip(wire.submit(8, inputs))
    assert isinstance(untraced, wire.Submit) and untraced.trace is None


def test_a_traced_jobs_batches_cross_the_wire_in_done_and_failed() -> None:
    runs = [
        BatchRun(10**18, 10**18 + 5, 4, 20, 2, (REF_A, REF_C), failed=False),
        BatchRun(10**18 + 9, 10**18 + 11, 1, 7, 1, (REF_A,), failed=True),
    ]
    done = round_trip(wire.Done(3, False, [], 0.5, wire.runs(runs)))
    failed = round_trip(wire.Failed(4, "model_error", "boom", 0.5, wire.runs(runs)))
    assert isinstance(done, wire.Done) and isinstance(failed, wire.Failed)
    assert wire.batch_runs(done.runs) == runs
    assert wire.batch_runs(failed.runs) == runs
    assert wire.batch_runs(wire.runs([])) == []
