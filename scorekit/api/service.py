"""The service endpoints: health, load, models, metrics, version and the OpenAPI document."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import msgspec

from scorekit import __version__
from scorekit.api.state import ServerState
from scorekit.http import HTTPError, Request, Response, shutting_down
from scorekit.metrics import CONTENT_TYPE
from scorekit.schemas import LoadResponse, ModelCard, ModelList, ModelPermission, VersionResponse


async def alive(request: Request) -> Response:
    """Liveness (/healthz): 200 with an empty body whenever the process answers at all, loading, draining or with
    a dead model worker alike (readiness says those), so an orchestrator restarts only a process that hangs."""
    return Response(b"", media_type=None)


async def health(request: Request) -> Response:
    """Readiness (/health, /ping, /readyz): 200 with an empty body once every model is loaded and warmed up (an
    engine joins the registry only after its warm-up forward) while its worker is alive and the server is not
    draining; 503 saying why otherwise. A load balancer takes a replica with one dead model out of rotation: its
    requests would fail here and succeed elsewhere."""
    state: ServerState = request.state
    for served in state.models:
        death = served.engine.health.death if served.engine is not None else None
        if death is not None:
            whose = "model" if len(state.models.names) == 1 else f"model `{served.name}`"
            raise HTTPError(503, f"The {whose} worker died: {type(death).__name__}.")
    if state.draining():
        raise shutting_down()
    for served in state.models:
        if served.engine is None or not served.engine.ready:
            state.models.resolve(served.name)  # NotReady (503) while a model is still loading or warming up
    return Response(b"", media_type=None)


async def load(request: Request) -> LoadResponse:
    state: ServerState = request.state
    by_model = {served.name: served.engine.active_requests if served.engine else 0 for served in state.models}
    return LoadResponse(server_load=state.load.routed, models=by_model)


async def models(request: Request) -> ModelList:
    """vLLM's model list, every served model in order, the default first, with ``root`` naming where the
    weights came from (see ``_weights_root``)."""
    state: ServerState = request.state
    cards = [
        ModelCard(
            id=served.name,
            created=state.started_at,
            root=_weights_root(served.engine.card.name if served.engine else served.spec.path or ""),
            max_model_len=served.engine.card.max_length if served.engine else 0,
            permission=[ModelPermission(id=f"modelperm-{uuid.uuid4().hex}", created=state.started_at)],
        )
        for served in state.models
    ]
    return ModelList(data=cards)


def _weights_root(model: str) -> str:
    """The folder the engine loaded (the embedded model's, not the hub name it was copied from), made
    absolute since a client cannot know the server's working directory; a hub name stays as given."""
    folder = Path(model)
    return str(folder.resolve()) if folder.is_dir() else model


async def version(request: Request) -> VersionResponse:
    """vLLM's ``/version``: deployment scripts log it and check it before rolling a replica."""
    return VersionResponse(version=__version__)


async def metrics(request: Request) -> Response:
    state: ServerState = request.state
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    state: ServerState = request.state
    return Response(_mounted(state.openapi, request.root_path))


@functools.lru_cache(maxsize=16)
def _mounted(document: bytes, root_path: str) -> bytes:
    """``document`` as seen under a mount: a ``servers`` entry with the prefix, so clients generated
    from it call ``/scoring/rerank`` and not ``/rerank``. Built once per prefix (a process has one or two)."""
    if not root_path:
        return document
    decoded = msgspec.json.decode(document)
    return msgspec.json.encode({**decoded, "servers": [{"url": root_path}]})
