"""Property-test ASGI apps and middleware against scripted fakes of uvicorn, hypercorn, granian and Ray Serve.

The ASGI spec leaves room for servers to disagree about ``receive``: how a body is cut into messages,
what two concurrent callers get, whether ``http.disconnect`` is repeated, and what ``receive()`` does
once the response is complete. Code that works on one server can lose a body, hang or double-count on
another. This kit makes those differences reproducible in logical time (no sockets, no sleeps).

The names here are what a property test needs: the flavours and backends to parametrize over, a
:class:`ClientScript` (or a :class:`Scenario` with an :class:`AppBehaviour`), the drivers that play one
(:func:`play`, :func:`play_scenario`, :func:`run_script`, :func:`run_scenario`), the :class:`Outcome`
they return, and :func:`make_server` for a test that drives the server by hand. Everything else stays in
its submodule:

- :mod:`scorekit.testing.servers`: the fake servers and their client-side control API;
- :mod:`scorekit.testing.audit`: the :class:`~scorekit.testing.audit.Audit` a fake server records;
- :mod:`scorekit.testing.scopes`: the scope each flavour builds (granian's shared dicts included);
- :mod:`scorekit.testing.apps`: scripted app behaviours that record what an app observes;
- :mod:`scorekit.testing.driver`: client scripts and the driver;
- :mod:`scorekit.testing.strategies`: Hypothesis strategies for all of the above. It is imported on
  first use (``scorekit.testing.strategies``), so the rest of the kit works without Hypothesis; using
  it without Hypothesis raises an ImportError that says to ``pip install hypothesis``.

See ``docs/testing.md`` for a complete example.
"""

import importlib
from types import ModuleType

from scorekit.testing.apps import AppBehaviour
from scorekit.testing.driver import (
    BACKENDS,
    AsyncBackend,
    ClientScript,
    Outcome,
    Scenario,
    play,
    play_scenario,
    run_scenario,
    run_script,
)
from scorekit.testing.scopes import FLAVORS, Flavor
from scorekit.testing.servers import make_server

__all__ = [
    "BACKENDS",
    "FLAVORS",
    "AppBehaviour",
    "AsyncBackend",
    "ClientScript",
    "Flavor",
    "Outcome",
    "Scenario",
    "make_server",
    "play",
    "play_scenario",
    "run_scenario",
    "run_script",
]


def __getattr__(name: str) -> ModuleType:
    """Import the strategies on first use: Hypothesis is needed only by code that uses them."""
    if name == "strategies":
        return importlib.import_module("scorekit.testing.strategies")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
