"""What the scoring endpoints share: typed decoding (which also notes the request's priority and deadline on its
ticket), request limits and response ids."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from functools import cache, partial
from typing import Any, TypeVar

import anyio.to_thread
import msgspec

from scorekit import tracing
from scorekit.api.decoding import DecodeBudget
from scorekit.api.state import ServerState
from scorekit.http import HTTPError, Request, bad_request
from scorekit.logs import current_request_id
from scorekit.schemas import Chunk, RerankRequest, ScoreRequest
from scorekit.settings import Settings
from scorekit.tasks import Chunking, PairOptions, PairScores
from scorekit.ticket import current_ticket

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")

logger = logging.getLogger("scorekit.api")
_FIELD_AT = re.compile(r"at `\$\.([A-Za-z_0-9]+)")
_MISSING = re.compile(r"missing required field `([A-Za-z_0-9]+)`")
# The header that gives a request's deadline, in seconds from its arrival (docs/api.md).
REQUEST_TIMEOUT = "X-Request-Timeout"
# Decoding this much JSON takes about a millisecond: cheaper inline than a thread hop.
INLINE_DECODE_BYTES = 256 << 10


# Any JSON body as plain values, converted into a Struct where the keys matter before the Struct is known.
_PLAIN: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
# Any JSON body, an object's or an array's values left undecoded (msgspec skims them): its keys, when the plain
# decode refuses a value that a Struct's decoder would name (a number no Python float holds, a nesting too deep).
_Skimmed = dict[str, msgspec.Raw] | list[msgspec.Raw] | str | int | float | bool | None
_SKIM: msgspec.json.Decoder[_Skimmed] = msgspec.json.Decoder(_Skimmed)


@cache
def _decoder(kind: type[S]) -> msgspec.json.Decoder[S]:
    return msgspec.json.Decoder(kind)


async def decode(request: Request, kind: type[S], *, parsed_in_handler: bool = False) -> S:
    """The typed body (see :func:`_typed`), its request's schedule noted on its ticket: the body's ``priority``
    (vLLM's field, where the body has one; lower runs earlier) and the deadline ``X-Request-Timeout`` gives, in
    seconds from now, by which the request's model work must have started (a 400 naming the header when it is not
    a number of seconds more than 0)."""
    timeout = _timeout(request)
    started = time.monotonic()
    body = await _typed(request, kind, parsed_in_handler)
    ticket = current_ticket()
    priority = getattr(body, "priority", 0)
    ticket.priority = priority if isinstance(priority, int) else 0
    if timeout is not None:
        ticket.deadline, ticket.timeout = started + timeout, timeout
    return body


def _timeout(request: Request) -> float | None:
    """The request's ``X-Request-Timeout`` in seconds (None without one), or a 400 that names it."""
    given = request.header(REQUEST_TIMEOUT)
    if given is None:
        return None
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise bad_request(
            f"{REQUEST_TIMEOUT} must be a number of seconds more than 0, not {given[:40]!r}.", REQUEST_TIMEOUT
        )
    return seconds


async def _typed(request: Request, kind: type[S], parsed_in_handler: bool) -> S:
    """The typed body, or a 400 that names the offending field. A large body decodes in a thread: a
    16 MB list of millions of empty strings takes most of a second, which the event loop must not wait.

    A body vLLM refuses before its handler runs is FastAPI's validation error, which vLLM answers with
    type "Bad Request" and param the place in the body ("body.top_n"). ``parsed_in_handler`` is for the
    route whose handler vLLM lets parse the body itself (/generative_scoring): there a bad body is a plain
    ValueError, BadRequestError with no param.

    A body a route has decoded already (``request.decoded``, /invocations') is not decoded again."""
    if isinstance(request.decoded, kind):
        return request.decoded
    if logger.isEnabledFor(logging.DEBUG):
        return await _decode(request, partial(_noting_ignored, kind), parsed_in_handler)
    return await _decode(request, _decoder(kind).decode, parsed_in_handler)


def _noting_ignored(kind: type[S], body: bytes) -> S:
    """The typed body from the one decode that also finds the fields it ignores, which are logged (debug)."""
    try:
        plain = _PLAIN.decode(body)
        decoded: S = msgspec.convert(plain, kind)
    except (msgspec.MsgspecError, RecursionError):
        typed: msgspec.json.Decoder[S] = _decoder(kind)
        return typed.decode(body)  # a body it refuses, refused in the typed decoder's own words
    ignored = sorted(set(plain) - set(kind.__struct_fields__))
    if ignored:
        logger.debug("The following fields were present in the request but ignored: %s", ignored)
    return decoded


Choose = Callable[[frozenset[str] | None], type[msgspec.Struct]]


async def decode_by_keys(request: Request, choose: Choose) -> tuple[type[msgspec.Struct], msgspec.Struct | None]:
    """The body decoded once into the Struct that ``choose`` picks from its keys (None: JSON that is not an
    object). A body that is not JSON at all is refused exactly as /score refuses it; a body the chosen Struct
    refuses comes back as None, for the route's own :func:`decode` to refuse in that route's words."""
    return await _decode(request, partial(_chosen, choose), parsed_in_handler=False)


def _chosen(choose: Choose, body: bytes) -> tuple[type[msgspec.Struct], msgspec.Struct | None]:
    try:
        plain: Any = _PLAIN.decode(body)
    except (msgspec.ValidationError, RecursionError):
        plain = _SKIM.decode(body)  # valid JSON whose plain values are refused: its keys, for choose
    kind = choose(frozenset(plain) if isinstance(plain, dict) else None)
    try:
        return kind, msgspec.convert(plain, kind)
    except msgspec.ValidationError:
        return kind, None


# What a body that cannot be taken raises while it is decoded: the client's fault, answered 400 below.
_NOT_DECODED = (msgspec.ValidationError, msgspec.DecodeError, RecursionError)


async def _decode(request: Request, parse: Callable[[bytes], T], parsed_in_handler: bool) -> T:
    """``parse`` run on the body: inline when small, else in a thread once the server's
    :class:`~scorekit.api.decoding.DecodeBudget` has room for it; a body that cannot be taken is a 400."""
    media_type = (request.header("content-type") or "").split(";")[0].strip().lower()
    if media_type != "application/json":
        # vLLM's words and status (400, not 415); its validate_json_request raises it as a validation
        # error with no place in the body, so no param.
        raise HTTPError(400, "Unsupported Media Type: Only 'application/json' is allowed", error_type="Bad Request")
    body = request.body
    try:
        with tracing.span("decode", {"scorekit.body_bytes": len(body)}, client_errors=_NOT_DECODED):
            return await _parsed(request, parse, body)
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = _FIELD_AT.search(message) or _MISSING.search(message)
        raise _refused(message, f"body.{found.group(1)}" if found else "body", parsed_in_handler) from None
    except msgspec.DecodeError as exc:
        raise _refused(f"Invalid JSON: {exc}", "body", parsed_in_handler) from None
    except RecursionError:  # msgspec's depth guard; no valid request nests this deep
        raise _refused("Invalid JSON: the body is nested too deeply.", "body", parsed_in_handler) from None


async def _parsed(request: Request, parse: Callable[[bytes], T], body: bytes) -> T:
    if len(body) <= INLINE_DECODE_BYTES:
        return parse(body)
    budget: DecodeBudget | None = request.state.decoding if request.state is not None else None
    if budget is None:
        return await anyio.to_thread.run_sync(parse, body)
    async with budget.hold(len(body)):
        return await anyio.to_thread.run_sync(parse, body)


def _refused(message: str, place: str, parsed_in_handler: bool) -> HTTPError:
    """A body that cannot be taken, as vLLM answers it (see :func:`decode`)."""
    if parsed_in_handler:
        return bad_request(message)
    return HTTPError(400, message, param=place, error_type="Bad Request")


def response_id(request: Request, prefix: str, body_id: str | None = None) -> str:
    """As vLLM: the ``X-Request-Id`` header wins over the body's ``request_id``; neither: the request's own id,
    fresh for it, which its log lines carry too."""
    return f"{prefix}-{request.header('x-request-id') or body_id or current_request_id()}"


def now() -> int:
    return int(time.time())


def check_count(state: ServerState, count: int, param: str) -> None:
    limit = state.settings.max_items_per_request
    if count > limit:
        raise bad_request(f"{count} inputs were given; this server accepts at most {limit} per request.", param)


def pair_options(body: ScoreRequest | RerankRequest, settings: Settings) -> PairOptions:
    """The cutting and finishing fields that /score and /rerank share, as the engine takes them. A request
    that sets ``max_chunks_per_doc`` chunks; one that sets ``truncate_prompt_tokens`` truncates; one that
    sets neither gets the server's ``--long-documents``."""
    if body.max_chunks_per_doc is not None and body.truncate_prompt_tokens is not None:
        raise bad_request(
            "Give max_chunks_per_doc (score a long document by its best window) or truncate_prompt_tokens "
            "(cut it), not both.",
            "max_chunks_per_doc",
        )
    chunking = None
    if body.max_chunks_per_doc is not None:
        chunking = Chunking(body.max_chunks_per_doc, settings.chunk_overlap)
    elif settings.long_documents == "chunk" and body.truncate_prompt_tokens is None:
        chunking = Chunking(None, settings.chunk_overlap)
    if body.return_chunks and chunking is None:
        raise bad_request(
            "return_chunks says which window of a chunked document won, and this request is not chunked: give "
            "max_chunks_per_doc (or start the server with --long-documents chunk).",
            "return_chunks",
        )
    return PairOptions(
        body.truncate_prompt_tokens,
        body.truncation_side,
        body.use_activation,
        body.max_tokens_per_query,
        body.max_tokens_per_doc,
        body.instruction,
        chunking,
        score_mode=body.score_mode,
        score_weights=None if body.score_weights is None else tuple(body.score_weights),
    )


def chunks_of(body: ScoreRequest | RerankRequest, scores: PairScores) -> list[Chunk] | None:
    """Each pair's winning window, when the request asked for them."""
    if not body.return_chunks or scores.windows is None:
        return None
    return [Chunk(window.index, window.count, window.start, window.end) for window in scores.windows]
