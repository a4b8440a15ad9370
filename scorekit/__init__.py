"""scorekit: a raw ASGI microframework for scoring models, with one explicit lifecycle middleware.

The top-level names load lazily, so ``import scorekit.testing`` or ``scorekit.lifecycle`` never
pulls in torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "create_app": "scorekit.app",
    "ScorekitApp": "scorekit.app",
    "Settings": "scorekit.settings",
    "LifecycleMiddleware": "scorekit.lifecycle",
    "LoadCounter": "scorekit.load",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'scorekit' has no attribute {name!r}")
