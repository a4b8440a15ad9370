"""`scorekit` as a user runs it: entry points, help, and start-up errors as one line on stderr."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.cli.conftest import ROOT, one_line_error, scorekit
from tests.live import free_port
from tests.tiny_models import MAX_POSITIONS


def test_python_m_scorekit_and_version() -> None:
    result = scorekit("--version")
    assert (result.returncode, result.stdout.strip()) == (0, "scorekit 0.1.0")


def test_bare_scorekit_prints_help() -> None:
    result = scorekit()
    assert result.returncode == 0, result.stderr
    assert "usage: scorekit" in result.stdout and "serve" in result.stdout
    assert result.stderr == ""


def test_serve_help_is_quick_and_loads_no_torch() -> None:
    started = time.monotonic()
    result = scorekit("serve", "--help", env={"SCOREKIT_PORT": "abc"})
    elapsed = time.monotonic() - started
    print(f"`python -m scorekit serve --help`: {elapsed:.2f} s wall")
    assert result.returncode == 0, result.stderr
    assert "examples:" in result.stdout
    # The deterministic form of "quick": parsing every flag imports none of the heavy libraries.
    check = (
        "import sys; from scorekit.cli import parse; parse(['serve', '--port', '9000']); "
        "heavy = sorted({'torch', 'transformers', 'uvicorn', 'scorekit.app'} & set(sys.modules)); "
        "assert not heavy, heavy"
    )
    probe = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr


def test_a_bad_flag_is_one_line() -> None:
    line = one_line_error(scorekit("serve", "--max-batch-size", "0"), 2)
    assert (
        line
        == "scorekit serve: error: argument --max-batch-size: must be at least 1, not 0 (see `scorekit serve --help`)"
    )
    line = one_line_error(scorekit("serve", env={"SCOREKIT_PORT": "abc"}), 2)
    assert "environment variable SCOREKIT_PORT" in line


@pytest.mark.parametrize("model", ["./no-such-model", "~/no-such-model-folder", "models/a/b"])
def test_a_missing_model_folder_says_so(model: str) -> None:
    line = one_line_error(scorekit("serve", model), 1)
    assert line.startswith("scorekit: error: ") and "no such folder" in line, line
    assert "hub" not in line.lower() and "cache" not in line


def test_a_model_file_is_not_a_folder(tmp_path: Path) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    assert "is a file" in one_line_error(scorekit("serve", "--model", str(file)), 1)


def test_debug_shows_the_traceback() -> None:
    result = scorekit("serve", "./no-such-model", "--debug")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "no such folder" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_one_line() -> None:
    line = one_line_error(scorekit("serve", "--device", "cuda", "--port", str(free_port())), 1)
    assert "CUDA is not available" in line


def test_the_wrong_model_kind_is_refused_in_one_line(cross_encoder_dir: Path) -> None:
    result = scorekit("serve", str(cross_encoder_dir), "--model-kind", "causal-lm", "--port", str(free_port()))
    line = one_line_error(result, 1)
    assert "cannot be served as a causal-lm" in line
    assert "BertForSequenceClassification, which is a cross-encoder" in line
    assert "Loading weights" not in result.stderr


def test_a_busy_port_is_said_before_the_model_loads() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = scorekit("serve", "--port", str(port))
    # One line and no start-up log: the process stopped before logging was set up and the model loaded.
    line = one_line_error(result, 1)
    assert (
        line == f"scorekit: error: cannot listen on 127.0.0.1:{port}: the port is in use (--debug shows the traceback)"
    )


def test_a_max_model_len_above_the_models_own_is_one_line(cross_encoder_dir: Path) -> None:
    result = scorekit("serve", str(cross_encoder_dir), "--max-model-len", "100000", "--port", str(free_port()))
    line = one_line_error(result, 1)
    assert "User-specified max_model_len (100000) is greater than the derived max_model_len" in line
    assert f"(max_length={MAX_POSITIONS} of model" in line
