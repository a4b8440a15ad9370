"""What a user may ask for at start-up, checked without torch: device and dtype names, and where a model lives.

A leaf module, so ``scorekit serve`` refuses a bad ``--device``, ``--dtype`` or model folder while parsing
its flags, before torch loads; the model loaders apply the same rules to an embedding app's Settings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICE = re.compile(r"cpu|cuda(:\d+)?")
# A Hugging Face hub name: "name" or "owner/name". Anything else (two slashes, a space...) can only be a path.
_HUB_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")


def device_error(device: str) -> str | None:
    """Why ``device`` is no device name scorekit knows, or None when it is one (availability is checked at load)."""
    if DEVICE.fullmatch(device) is None:
        return f"unsupported device {device!r}: use 'cpu', 'cuda' or 'cuda:N'"
    return None


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
