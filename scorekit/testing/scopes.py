"""What each server flavour builds around a request: its scope, and the body messages it delivers.

Why apart from the fakes: the scope is half of what differs between servers (granian shares its
``asgi`` and ``extensions`` dicts across requests, uvicorn and Ray Serve have no ``extensions`` for HTTP,
hypercorn speaks spec 2.1), and a test often needs just a scope, for example to call a middleware twice. The
final-request spellings live here too, since every flavour delivers them the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from scorekit.asgi import Message, Scope

Flavor = Literal["uvicorn", "hypercorn", "granian", "ray"]
FLAVORS: tuple[Flavor, ...] = ("uvicorn", "hypercorn", "granian", "ray")

SPEC_VERSIONS: dict[Flavor, str] = {"uvicorn": "2.3", "hypercorn": "2.1", "granian": "2.3", "ray": "2.3"}
"""The ASGI spec version each flavour's scope declares in ``scope["asgi"]["spec_version"]``."""

HeaderItem = tuple[str | bytes, str | bytes]


def final_request(*, omit_more_body: bool, omit_body: bool, body: bytes = b"") -> Message:
    """The ``http.request`` that ends a body, without the keys the client's script leaves out.

    Both ``more_body`` (default False) and ``body`` (default ``b""``) are optional in the spec, and an
    app must honour the defaults; a non-empty ``body`` is always kept.
    """
    message: Message = {"type": "http.request"}
    if body or not omit_body:
        message["body"] = body
    if not omit_more_body:
        message["more_body"] = False
    return message


_GRANIAN_ASGI: dict[str, Any] = {"version": "3.0", "spec_version": SPEC_VERSIONS["granian"]}
_GRANIAN_EXTENSIONS: dict[str, Any] = {"http.response.pathsend": {}}
_GRANIAN_ASGI_INITIAL = dict(_GRANIAN_ASGI)
_GRANIAN_EXTENSIONS_INITIAL = dict(_GRANIAN_EXTENSIONS)


def granian_shared_dicts() -> tuple[dict[str, Any], dict[str, Any]]:
    """The process-wide ``(asgi, extensions)`` dicts every granian-flavour scope refers to."""
    return _GRANIAN_ASGI, _GRANIAN_EXTENSIONS


def reset_granian_shared() -> None:
    """Restore the shared granian dicts in place (for test isolation after a deliberate pollution)."""
    _GRANIAN_ASGI.clear()
    _GRANIAN_ASGI.update(_GRANIAN_ASGI_INITIAL)
    _GRANIAN_EXTENSIONS.clear()
    _GRANIAN_EXTENSIONS.update(_GRANIAN_EXTENSIONS_INITIAL)


def _header_bytes(value: str | bytes) -> bytes:
    return value.encode("latin-1") if isinstance(value, str) else value


def make_scope(
    flavor: Flavor,
    *,
    path: str = "/",
    method: str = "GET",
    headers: Iterable[HeaderItem] = (),
    query_string: bytes = b"",
    root_path: str = "",
    state: dict[str, Any] | None = None,
    type: Literal["http", "websocket", "lifespan"] = "http",
) -> Scope:
    """The scope the flavour's server would build for one request (header names lower-cased bytes).

    uvicorn: a fresh ``asgi`` dict (spec 2.3), no ``extensions`` key for HTTP, ``state`` a shallow copy.
    hypercorn: spec 2.1, fresh ``extensions`` (empty for HTTP/1.1), ``state`` copied.
    granian: the **process-wide** ``asgi`` and ``extensions`` dicts (see :func:`granian_shared_dicts`).
    ray: uvicorn's (Ray Serve's proxy runs uvicorn and hands its scope to the replica).
    """
    state_copy = dict(state) if state is not None else {}
    if flavor == "granian":
        asgi, extensions = _GRANIAN_ASGI, _GRANIAN_EXTENSIONS
    else:
        asgi = {"version": "3.0", "spec_version": SPEC_VERSIONS[flavor]}
        extensions = {}
    if type == "lifespan":
        return {"type": "lifespan", "asgi": asgi, "state": state_copy}
    header_list = [(_header_bytes(name).lower(), _header_bytes(value)) for name, value in headers]
    scope: Scope = {
        "type": type,
        "asgi": asgi,
        "http_version": "1.1",
        "scheme": "ws" if type == "websocket" else "http",
        "path": path,
        "raw_path": path.encode("utf-8"),
        "query_string": query_string,
        "root_path": root_path,
        "headers": header_list,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": state_copy,
    }
    if type == "http":
        scope["method"] = method.upper()
    if flavor not in ("uvicorn", "ray") or type == "websocket":
        scope["extensions"] = extensions
    return scope
