"""vLLM's per-handler lifecycle decorators, paraphrased, for the naive server and the FastAPI app.

vLLM wraps each OpenAI-server handler in ``with_cancellation`` (race the handler against a task
that listens for ``http.disconnect``) and ``load_aware_call`` (count the request in
``app.state.server_load_metrics``). The comparison apps use the same pattern so that what we
compare scorekit's single lifecycle middleware against is the real alternative, not a straw man.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.background import BackgroundTask, BackgroundTasks
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])


def _raw_request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Request:
    found = kwargs.get("raw_request", args[1] if len(args) > 1 else None)
    if not isinstance(found, Request):
        raise ValueError("raw_request required when server load tracking is enabled")
    return found


async def listen_for_disconnect(request: Request) -> None:
    """Read (and throw away) messages until the disconnect; it gives back the load it counted."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            state = request.app.state
            if getattr(state, "enable_server_load_tracking", False) and hasattr(state, "server_load_metrics"):
                state.server_load_metrics -= 1
            return


def with_cancellation(handler: F) -> F:
    """Run the handler beside a disconnect listener; whichever ends first cancels the other.

    The body must already be read: the listener consumes every message it sees.
    """

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = _raw_request(args, kwargs)
        handler_task: asyncio.Task[Any] = asyncio.create_task(handler(*args, **kwargs))
        listener = asyncio.create_task(listen_for_disconnect(request))
        done, pending = await asyncio.wait({handler_task, listener}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return handler_task.result() if handler_task in done else None

    return wrapper  # type: ignore[return-value]


def load_aware_call(handler: F) -> F:
    """+1 on entry; -1 after the response is sent (as a background task), or at once for non-responses."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = _raw_request(args, kwargs)
        state = request.app.state
        if not getattr(state, "enable_server_load_tracking", False):
            return await handler(*args, **kwargs)
        state.server_load_metrics = getattr(state, "server_load_metrics", 0) + 1
        try:
            response = await handler(*args, **kwargs)
        except Exception:
            state.server_load_metrics -= 1
            raise

        def decrement() -> None:
            state.server_load_metrics -= 1

        if isinstance(response, JSONResponse | StreamingResponse):
            if response.background is None:
                response.background = BackgroundTask(decrement)
            elif isinstance(response.background, BackgroundTasks):
                response.background.add_task(decrement)
            else:
                tasks = BackgroundTasks()
                tasks.add_task(response.background.func, *response.background.args, **response.background.kwargs)
                tasks.add_task(decrement)
                response.background = tasks
        else:
            decrement()
        return response

    return wrapper  # type: ignore[return-value]
