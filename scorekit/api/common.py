"""What the scoring endpoints share: typed decoding, model checks, ids, and engine error mapping."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

import anyio.to_thread
import msgspec
import torch

from scorekit.api.state import ServerState
from scorekit.engine import Engine, Overloaded
from scorekit.http import HTTPError, Request, bad_request
from scorekit.models.base import Checkpoint, Encoded, InputTooLong
from scorekit.worker import ModelFailure

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")

logger = logging.getLogger("scorekit.api")
_FIELD_AT = re.compile(r"at `\$\.([A-Za-z_0-9]+)")
_MISSING = re.compile(r"missing required field `([A-Za-z_0-9]+)`")
_RETRY_AFTER = [(b"retry-after", b"1")]
# Decoding this much JSON takes about a millisecond: cheaper inline than a thread hop.
INLINE_DECODE_BYTES = 256 << 10


@cache
def _decoder(kind: type[S]) -> msgspec.json.Decoder[S]:
    return msgspec.json.Decoder(kind)


async def decode(request: Request, kind: type[S]) -> S:
    """The typed body, or a 400 that names the offending field. A large body decodes in a thread: a
    16 MB list of millions of empty strings takes most of a second, which the event loop must not wait."""
    media_type = (request.header("content-type") or "").split(";")[0].strip().lower()
    if media_type != "application/json":
        # vLLM's words and status (400, not 415): clients and vLLM's own tests match this exact message.
        raise bad_request("Unsupported Media Type: Only 'application/json' is allowed", "content-type")
    try:
        if len(request.body) <= INLINE_DECODE_BYTES:
            decoded: S = _decoder(kind).decode(request.body)
        else:
            decoded = await anyio.to_thread.run_sync(_decoder(kind).decode, request.body)
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = _FIELD_AT.search(message) or _MISSING.search(message)
        raise bad_request(message, found.group(1) if found else None) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"Invalid JSON: {exc}") from None
    except RecursionError:  # msgspec's depth guard; no valid request nests this deep
        raise bad_request("Invalid JSON: the body is nested too deeply.") from None
    if logger.isEnabledFor(logging.DEBUG):
        _log_ignored_fields(request.body, kind)
    return decoded


def _log_ignored_fields(body: bytes, kind: type[msgspec.Struct]) -> None:
    raw: Any = msgspec.json.decode(body)
    ignored = sorted(set(raw) - set(kind.__struct_fields__))
    if ignored:
        logger.debug("The following fields were present in the request but ignored: %s", ignored)


def check_model(state: ServerState, model: str | None) -> str:
    """The served name; any other non-empty name is a 404 (as vLLM answers)."""
    if model and model != state.served_model_name:
        raise HTTPError(404, f"The model `{model}` does not exist.", param="model")
    return state.served_model_name


def response_id(request: Request, prefix: str) -> str:
    return f"{prefix}-{request.header('x-request-id') or uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def check_count(state: ServerState, count: int, param: str) -> None:
    limit = state.settings.max_items_per_request
    if count > limit:
        raise bad_request(f"{count} inputs were given; this server accepts at most {limit} per request.", param)


def not_supported(api: str) -> HTTPError:
    """The served model's kind cannot answer this endpoint (``api`` names the endpoint, e.g. "Rerank")."""
    return HTTPError(501, f"The model does not support the {api} API.")


@contextmanager
def engine_errors(param_of: Callable[[int], str] | None = None) -> Iterator[None]:
    """Map engine and backend failures to the error shape; ``param_of`` names an input by index."""
    try:
        yield
    except Overloaded as exc:
        raise HTTPError(
            503,
            f"The server is busy and cannot accept new requests ({exc}). Please try again later.",
            headers=list(_RETRY_AFTER),
        ) from None
    except InputTooLong as exc:
        # The backend's index is into the inputs it was given (each distinct one once), not the request's.
        param = param_of(exc.index) if param_of else "input_tokens"
        size = f"{exc.length} tokens" if exc.length is not None else f"{exc.chars} characters"
        raise bad_request(
            f"{param} has {size}, but the model's maximum length is {exc.maximum} tokens. "
            "Please reduce the length of the input prompt, or set truncate_prompt_tokens.",
            param,
        ) from None
    except ModelFailure as exc:
        raise HTTPError(500, str(exc)) from None
    except ValueError as exc:
        raise bad_request(str(exc)) from None


async def run_admitted(
    engine: Engine,
    tokenize: Callable[[Checkpoint], list[Encoded]],
    *,
    count: int,
    chars: int,
    param_of: Callable[[int], str] | None = None,
) -> tuple[list[Encoded], list[torch.Tensor]]:
    """Check the request fits, admit it, tokenize (off the loop when large) and run its ``count`` inputs.

    Every limit that the request's shape decides is checked before any tokenizing, so an impossible
    request costs nothing but its decoding.
    """
    _check_fits(engine, count)
    with engine_errors(param_of), engine.admit():
        inputs = await engine.prepare(tokenize, chars=chars)
        outputs = await engine.run(inputs)
    return inputs, outputs


def _check_fits(engine: Engine, count: int) -> None:
    """A request larger than the whole queue can never be admitted: a 400 now, not a 503 that says retry."""
    limit = engine.config.max_queued_items
    if count > limit:
        raise bad_request(
            f"This request needs {count} model inputs, but the server queues at most {limit}; "
            "send it as several smaller requests."
        )
