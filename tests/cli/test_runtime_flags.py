"""--runtime onnx refuses, in one line and exit 2, what ONNX Runtime cannot serve: a causal LM (given or detected),
a GPU, a dtype other than float32, and a missing extra; --runtime openvino a GPU, float16 and a missing extra;
--runtime torchscript a detected causal LM too; the library refuses the same with a ValueError."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from scorekit.cli import parse
from scorekit.models import load_backend
from tests.cli.conftest import one_line_error, scorekit
from tests.cli.test_parsing import refused
from tests.live import free_port
from tests.tiny_models import build_causal_lm


@pytest.fixture(autouse=True)
def no_scorekit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SCOREKIT_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("runtime", "flags", "said"),
    [
        (
            "onnx",
            ["--model-kind", "llm-reranker"],
            "--runtime onnx serves bi-encoders and cross-encoders; a llm-reranker",
        ),
        ("onnx", ["--model-kind", "causal-lm"], "a causal-lm reuses a shared prefix's KV cache"),
        ("onnx", ["--device", "cuda"], "--runtime onnx runs on the CPU only, not on 'cuda'"),
        ("onnx", ["--dtype", "bfloat16"], "--runtime onnx serves float32 only: ONNX Runtime has no bfloat16 kernels"),
        ("onnx", ["--dtype", "float16"], "ONNX Runtime has no float16 kernels"),
        ("openvino", ["--model-kind", "causal-lm"], "--runtime openvino serves bi-encoders and cross-encoders"),
        ("openvino", ["--device", "cuda:0"], "--runtime openvino runs on the CPU only, not on 'cuda:0'"),
        ("openvino", ["--dtype", "float16"], "--runtime openvino serves float32 and bfloat16, not float16, on the CPU"),
    ],
)
def test_what_an_onnx_runtime_cannot_serve_is_refused_while_parsing(
    runtime: str, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert said in refused(["serve", "--runtime", runtime, *flags], capsys)


@pytest.mark.parametrize(("runtime", "names"), [("onnx", "ONNX Runtime and onnx"), ("openvino", "OpenVINO and onnx")])
def test_a_missing_extra_says_what_to_install(
    runtime: str, names: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    line = refused(["serve", "--runtime", runtime], capsys)
    assert f"--runtime {runtime} needs {names}, which are not installed: pip install -e '.[{runtime}]' (see" in line
    monkeypatch.undo()
    assert parse(["serve", "--runtime", runtime]).settings.models[0].runtime == runtime
    assert parse(["serve", "--runtime", runtime, "--dtype", "float32"]).settings.models[0].dtype == "float32"


@pytest.fixture(scope="module")
def causal_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_causal_lm(tmp_path_factory.mktemp("causal-lm"))


def test_the_library_refuses_alike(causal_lm_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"^--runtime onnx runs on the CPU only"):
        load_backend("unused", runtime="onnx", device="cuda")
    with pytest.raises(ValueError, match=r"^--runtime onnx serves float32 only"):
        load_backend("unused", runtime="onnx", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"a causal-lm reuses a shared prefix's KV cache"):
        load_backend(str(causal_lm_dir), runtime="onnx")  # the kind detected


@pytest.mark.parametrize("runtime", ["onnx", "torchscript"])
def test_a_detected_causal_lm_is_refused_before_it_loads(causal_lm_dir: Path, runtime: str) -> None:
    if runtime == "onnx":
        pytest.importorskip("onnxruntime")
    result = scorekit("serve", str(causal_lm_dir), "--runtime", runtime, "--port", str(free_port()))
    line = one_line_error(result, 2)
    assert f"--runtime {runtime} serves bi-encoders and cross-encoders; a causal-lm" in line
    assert line.endswith(f"(model {str(causal_lm_dir)!r} is a causal-lm) (see `scorekit serve --help`)")
