"""/openapi.json, generated from the route table and the msgspec Structs (never written by hand).

It describes the router's table, so it sits with the router in the layers (docs/architecture.md) and imports
no endpoint; ``api/service.py`` serves the document that ``app.py`` builds with it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from scorekit.routing import Alias, Route
from scorekit.schemas import ErrorBody

_REF = "#/components/schemas/{name}"


def build_openapi(table: Iterable[Route | Alias], *, title: str, version: str) -> bytes:
    entries = list(table)
    routes = {entry.path: entry for entry in entries if isinstance(entry, Route)}
    shapes = {shape for r in routes.values() for t in (r.body, r.returns) if t is not None for shape in _shapes(t)}
    ordered = [ErrorBody, *sorted(shapes, key=repr)]
    schemas, components = msgspec.json.schema_components(ordered, ref_template=_REF)
    schema_of = dict(zip(ordered, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for entry in entries:
        route = routes[entry.to] if isinstance(entry, Alias) else entry
        operation = _operation(route, entry.path, schema_of)
        if isinstance(entry, Alias):
            operation = {**operation, "summary": f"Alias of {route.path}."}
            if entry.deprecated:
                operation["deprecated"] = True
        paths.setdefault(entry.path, {})[route.method.lower()] = operation
    document = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": components},
    }
    return msgspec.json.encode(document)


def _shapes(described: Any) -> tuple[Any, ...]:
    """The types a route's ``body`` or ``returns`` names: one, or each of a tuple of them."""
    return described if isinstance(described, tuple) else (described,)


def _one_of(described: Any, schema_of: dict[Any, Any]) -> Any:
    schemas = [schema_of[shape] for shape in _shapes(described)]
    return schemas[0] if len(schemas) == 1 else {"oneOf": schemas}


def _operation(route: Route, path: str, schema_of: dict[Any, Any]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorBody")}}}}
    ok: dict[str, Any] = {"description": "OK"}
    if route.returns is not None:
        ok["content"] = {"application/json": {"schema": _one_of(route.returns, schema_of)}}
    operation: dict[str, Any] = {
        "summary": route.summary,
        "operationId": path.strip("/").replace("/", "_").replace(".", "_"),
        "responses": {"200": ok, "400": {**error, "description": "Bad request"}},
    }
    if route.body is not None:
        schema = _one_of(route.body, schema_of)
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        operation["responses"].update(
            {
                "404": {**error, "description": "Unknown model, or the model does not support this API"},
                "413": {**error, "description": "Body too large"},
                "500": {**error, "description": "The model failed on this batch"},
                "503": {**error, "description": "Busy: retry after the Retry-After header"},
            }
        )
    return operation
