"""The service endpoints: health, load, models, metrics and the OpenAPI document."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import msgspec

from scorekit.api.state import ServerState, shutting_down
from scorekit.http import HTTPError, Request, Response
from scorekit.metrics import CONTENT_TYPE
from scorekit.models import default_model_path
from scorekit.schemas import LoadResponse, ModelCard, ModelList, ModelPermission


async def health(request: Request) -> Response:
    """200 with an empty body while the model worker is alive; 503 saying why otherwise."""
    state: ServerState = request.state
    engine = state.engine
    if engine is not None and not engine.worker.alive and engine.worker.death is not None:
        raise HTTPError(503, f"The model worker died: {type(engine.worker.death).__name__}.")
    if state.draining:
        raise shutting_down()
    state.ready_engine()
    return Response(b"", media_type=None)


async def load(request: Request) -> LoadResponse:
    state: ServerState = request.state
    return LoadResponse(server_load=state.load.routed)


async def models(request: Request) -> ModelList:
    """vLLM's model list, with ``root`` naming where the weights came from (see ``_weights_root``)."""
    state: ServerState = request.state
    engine = state.engine
    card = ModelCard(
        id=state.served_model_name,
        created=state.started_at,
        root=_weights_root(state.settings.model or default_model_path()),
        max_model_len=engine.backend.max_length if engine else 0,
        permission=[ModelPermission(id=f"modelperm-{uuid.uuid4().hex}", created=state.started_at)],
    )
    return ModelList(data=[card])


def _weights_root(model: str) -> str:
    """The folder the engine loaded (the embedded model's, not the hub name it was copied from), made
    absolute since a client cannot know the server's working directory; a hub name stays as given."""
    folder = Path(model)
    return str(folder.resolve()) if folder.is_dir() else model


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
