"""What a user may ask for at start-up, checked without torch: device, dtype and runtime names, what a runtime
can serve, and where a model lives.

A leaf module, so ``scorekit serve`` refuses a bad ``--device``, ``--dtype`` or model folder while parsing
its flags, before torch loads; the model loaders apply the same rules to an embedding app's Settings.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Literal, get_args

# What runs a bi-encoder's or cross-encoder's forward: the torch module, its ONNX export in ONNX Runtime (the
# onnx extra; CPU and float32 only, see runtime_error) or in OpenVINO (the openvino extra; CPU, float32 or
# bfloat16), or its TorchScript trace (any device and dtype).
Runtime = Literal["torch", "onnx", "openvino", "torchscript"]
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)
DTYPES = ("auto", "float32", "float16", "bfloat16")
# The kinds a runtime other than torch (ONNX Runtime, OpenVINO, a TorchScript trace) serves: one stateless forward
# per batch.
ONE_FORWARD_KINDS = ("bi-encoder", "cross-encoder")
# Why each other kind runs only in torch: what its forward does that an exported graph does not.
_TORCH_ONLY = {
    "causal-lm": "reuses a shared prefix's KV cache",
    "llm-reranker": "reuses a shared prefix's KV cache",
    "listwise-reranker": "reads its embeddings at marker tokens, a varying number per input",
    "sparse-encoder": "answers a varying number of non-zero weights per input",
    "late-interaction": "hides a query's expansion tokens from attention by their ids",
    "bge-m3": "answers the outputs each input asks for, a varying number of values",
}
# What each runtime that runs an ONNX export needs installed: the modules, their names, and the extra that has them.
# onnx is what torch's exporter writes the file with.
_RUNTIME_NEEDS = {
    "onnx": (("onnxruntime", "onnx"), "ONNX Runtime and onnx"),
    "openvino": (("openvino", "onnx"), "OpenVINO and onnx"),
}
# The dtypes a runtime that runs an ONNX export computes in on the CPU ("auto" is float32 there).
_RUNTIME_DTYPES = {"onnx": ("auto", "float32"), "openvino": ("auto", "float32", "bfloat16")}
DEVICE = re.compile(r"cpu|cuda(:\d+)?")
# A Hugging Face hub name: "name" or "owner/name". Anything else (two slashes, a space...) can only be a path.
_HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")


def device_error(device: str) -> str | None:
    """Why ``device`` is no device name scorekit knows, or None when it is one (availability is checked at load)."""
    if DEVICE.fullmatch(device) is None:
        return f"unsupported device {device!r}: use 'cpu', 'cuda' or 'cuda:N'"
    return None


def runtime_error(runtime: str, *, kind: str | None, device: str, dtype: str) -> str | None:
    """Why ``runtime`` cannot serve this model as asked (``kind`` None: not known yet), or None when it can."""
    if runtime not in RUNTIMES:
        return f"unsupported runtime {runtime!r}: use {', '.join(map(repr, RUNTIMES))}"
    if runtime == "torch":
        return None
    if kind is not None and kind not in ONE_FORWARD_KINDS:
        return (
            f"--runtime {runtime} serves bi-encoders and cross-encoders; a {kind} {_TORCH_ONLY.get(kind, 'runs')},"
            " which only --runtime torch runs"
        )
    if runtime == "torchscript":
        return None
    if device != "cpu":
        return f"--runtime {runtime} runs on the CPU only, not on {device!r}: use --runtime torch there"
    if dtype not in _RUNTIME_DTYPES[runtime]:
        if runtime == "onnx":
            return (
                f"--runtime onnx serves float32 only: ONNX Runtime has no {dtype} kernels for a transformer on the CPU"
                " (drop --dtype, use --runtime openvino for bfloat16, or --runtime torch)"
            )
        return f"--runtime {runtime} serves float32 and bfloat16, not {dtype}, on the CPU (or use --runtime torch)"
    return None


class UnfitRuntime(ValueError):
    """A runtime that cannot serve a model of the kind its config names: found only once the model's files were
    read, so after the flags were parsed. ``model`` is the model as given, ``kind`` the kind it turned out to be."""

    def __init__(self, message: str, *, model: str, kind: str) -> None:
        super().__init__(message)
        self.model = model
        self.kind = kind


def runtime_missing(runtime: str) -> str | None:
    """The line that says how to install what ``--runtime`` needs (the runtime, and onnx for the export), or None
    when it is all there (or the runtime needs nothing beyond torch)."""
    if runtime not in _RUNTIME_NEEDS:
        return None
    modules, names = _RUNTIME_NEEDS[runtime]
    if all(importlib.util.find_spec(module) is not None for module in modules):
        return None
    return f"--runtime {runtime} needs {names}, which are not installed: pip install -e '.[{runtime}]'"


def looks_like_path(name: str) -> bool:
    """True when ``name`` can only mean a folder: it starts with '.', '/' or '~', or no hub name is spelled so."""
    return name.startswith((".", "/", "~", os.sep)) or _HUB_NAME.fullmatch(name) is None


def local_model(name: str) -> str:
    """``name`` with a leading '~' expanded when it names a folder. A name that can only be a path and does not
    lead to a folder is a ValueError that says so, rather than the hub's "not a valid model identifier"."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if not looks_like_path(name):
        return name
    if path.exists():
        raise ValueError(f"Model {name!r} is a file; give the folder that holds the model's config.json.")
    raise ValueError(f"Model {name!r}: no such folder.")
