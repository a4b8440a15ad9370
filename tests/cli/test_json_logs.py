"""``--log-format json``: every line ``scorekit serve`` and the processes it starts write is one JSON object with the
same keys (time, level, logger, message, request_id, route, status, duration, model); the access line is
scorekit's own, naming the request's id, route, status, duration and model, and uvicorn's goes; a line logged while
a request runs carries its id. The text format stays the default. And ``--enforce-eager``, vLLM's flag, is taken.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from scorekit.cli import parse
from scorekit.logs import (
    JSON_KEYS,
    REQUEST_ID_LIMIT,
    JsonFormatter,
    RequestFields,
    RequestRecord,
    process_config,
    request_record,
)
from tests.cli.test_parsing import refused
from tests.hardening.process import scorekit_serve


@pytest.fixture(autouse=True)
def no_scorekit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SCOREKIT_"):
            monkeypatch.delenv(key)


def formatted(message: str, *, exc_info: Any = None, **extra: Any) -> dict[str, Any]:
    """A record of logger "scorekit.test" as the JSON format writes it, through the request filter, parsed."""
    record = logging.LogRecord("scorekit.test", logging.WARNING, __file__, 1, message, (), exc_info)
    record.__dict__.update(extra)
    assert RequestFields().filter(record)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def test_a_line_outside_a_request_has_every_key_and_nulls_for_the_request() -> None:
    line = formatted("hello there")
    assert tuple(line) == JSON_KEYS
    assert line["message"] == "hello there" and line["level"] == "WARNING" and line["logger"] == "scorekit.test"
    assert [line[key] for key in JSON_KEYS[4:]] == [None] * 5
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-01-02T03:04:05.678Z")


def test_a_line_inside_a_request_carries_its_id_route_and_model() -> None:
    with request_record(RequestRecord("abc", "/rerank")) as record:
        record.model = "tiny"
        line = formatted("inside")
    assert (line["request_id"], line["route"], line["model"], line["status"]) == ("abc", "/rerank", "tiny", None)
    assert formatted("after")["request_id"] is None  # the record is the request's alone


def test_a_traceback_is_one_field_of_the_one_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        line = formatted("failed", exc_info=sys.exc_info())
    assert line["message"] == "failed" and "RuntimeError: boom" in line["exception"]


def test_the_text_format_keeps_uvicorns_access_line_and_json_writes_scorekits() -> None:
    text, lines = process_config("info"), process_config("info", "json")
    silent = {"handlers": [], "propagate": False}
    assert (text["loggers"]["uvicorn.access"]["propagate"], text["loggers"]["scorekit.access"]) == (True, silent)
    assert (lines["loggers"]["scorekit.access"]["propagate"], lines["loggers"]["uvicorn.access"]) == (True, silent)
    assert text["formatters"]["scorekit"] == {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    assert parse(["serve"]).settings.access_log is False
    assert parse(["serve", "--log-format", "json"]).settings.access_log is True


def test_serve_logs_json_lines_with_the_request_id(tmp_path: Path, cross_encoder_dir: Path) -> None:
    """A process with its model in a model host process: the host's lines are JSON too."""
    flags = (str(cross_encoder_dir), "--log-format", "json", "--model-host", "process", "--served-model-name", "ce")
    long_id = "x" * (REQUEST_ID_LIMIT + 50)
    with scorekit_serve(tmp_path, *flags) as (proc, live, log):
        given = live.json("POST", "/rerank", {"query": "q", "documents": ["d"]}, headers={"X-Request-Id": "req-42"})
        fresh = live.json("POST", "/v1/rerank", {"query": "q", "documents": ["d"]})  # a deprecated alias: it warns
        bad = live.json("POST", "/rerank", {"query": "q"}, headers={"X-Request-Id": long_id})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    assert (given[0], given[1]["id"], fresh[0], bad[0]) == (200, "score-req-42", 200, 400)
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line parses
    assert all(tuple(line)[: len(JSON_KEYS)] == JSON_KEYS for line in lines)
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]
    access = [line for line in lines if line["logger"] == "scorekit.access" and line["route"] == "/rerank"]
    assert [(line["request_id"], line["status"], line["model"]) for line in access] == [
        ("req-42", 200, "ce"),
        (fresh[1]["id"].removeprefix("score-"), 200, "ce"),  # no header: the id the answer carries
        ("x" * REQUEST_ID_LIMIT, 400, None),  # refused before its body named a model
    ]
    assert all(isinstance(line["duration"], float) and line["duration"] > 0 for line in access)
    assert access[0]["message"].endswith('"POST /rerank HTTP/1.1" 200')
    assert access[1]["message"].endswith('"POST /v1/rerank HTTP/1.1" 200')
    warned = [line for line in lines if line["logger"] == "scorekit.routing"]
    assert [(line["level"], line["request_id"]) for line in warned] == [("WARNING", access[1]["request_id"])]
    hosted = [line["message"] for line in lines if line["logger"] == "scorekit.model_host"]
    assert len(hosted) == 3 and hosted[0].startswith("warmed up")
    # Start-up's objects frozen out of the collector's way: in the model host process, and in the server's once it
    # serves.
    frozen = [line.split(" ", 1) for line in hosted[1:]]
    assert all(
        rest.startswith("start-up objects kept out of the garbage collector's full passes") for _, rest in frozen
    )
    assert all(int(count) > 100_000 for count, _ in frozen)  # the model's and its libraries' objects, not a few
    assert any(line["logger"] == "scorekit.serving" and line["message"].startswith("serving on") for line in lines)


def test_enforce_eager_is_the_eager_runtime(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse(["serve", "--enforce-eager"]).settings.models[0].runtime == "torch"
    assert parse(["serve", "--enforce-eager", "--runtime", "torch"]).settings.models[0].runtime == "torch"
    line = refused(["serve", "--enforce-eager", "--runtime", "torchscript"], capsys)
    assert "--enforce-eager runs the eager runtime (torch), but --runtime is torchscript: leave one of them out" in line
    monkeypatch.setenv("SCOREKIT_RUNTIME", "onnx")
    assert "but --runtime is onnx" in refused(["serve", "--enforce-eager"], capsys)
    monkeypatch.delenv("SCOREKIT_RUNTIME")
    monkeypatch.setenv("SCOREKIT_ENFORCE_EAGER", "yes")
    assert "but --runtime is openvino" in refused(["serve", "--runtime", "openvino"], capsys)
