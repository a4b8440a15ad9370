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

from scorekit.settings import RUNTIMES

DTYPES = ("auto", "float32", "float16", "bfloat16")
# The kinds a runtime other than torch (ONNX Runtime, a TorchScript trace) serves: one stateless forward per batch.
# A causal LM reuses a shared prefix's KV cache across inputs, which only the torch module keeps.
ONE_FORWARD_KINDS = ("bi-encoder", "cross-encoder")
ONNX_EXTRA = "pip install -e '.[onnx]'"
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
            f"--runtime {runtime} serves bi-encoders and cross-encoders; a {kind} reuses a shared prefix's KV cache,"
            " which only --runtime torch runs"
        )
    if runtime == "torchscript":
        return None
    if device != "cpu":
        return f"--runtime onnx runs on the CPU only, not on {device!r}: use --runtime torch there"
    if dtype not in ("auto", "float32"):
        return (
            f"--runtime onnx serves float32 only: ONNX Runtime has no {dtype} kernels for a transformer on the CPU"
            " (drop --dtype, or use --runtime torch)"
        )
    return None


def onnx_missing() -> str | None:
    """The line that says how to install what ``--runtime onnx`` needs (ONNX Runtime, and onnx for the export),
    or None when both are there."""
    if all(importlib.util.find_spec(module) is not None for module in ("onnxruntime", "onnx")):
        return None
    return f"--runtime onnx needs ONNX Runtime and onnx, which are not installed: {ONNX_EXTRA}"


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
