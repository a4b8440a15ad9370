"""The one table from scorekit's typed errors (``scorekit.errors``) to an HTTP status and the error shape, and
how an endpoint names an over-long input in its error as its body spelled it.

The router asks it about any exception an endpoint lets out; what the table does not know (a bug in a
backend, a ValueError from a library) is logged and answered 500, never mistaken for the client's fault.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from scorekit.errors import (
    InputTooLong,
    InvalidRequest,
    ModelFailure,
    NotReady,
    Overloaded,
    Place,
    ScorekitError,
    UnknownModel,
    Unsupported,
)
from scorekit.http import HTTPError

_RETRY_AFTER = (b"retry-after", b"1")


def _invalid(error: ScorekitError, api: str) -> HTTPError:
    param = error.param if isinstance(error, InvalidRequest) else None
    return HTTPError(400, error.message, param=param)


def _unknown_model(error: ScorekitError, api: str) -> HTTPError:
    return HTTPError(404, error.message, param="model")


def _unsupported(error: ScorekitError, api: str) -> HTTPError:
    """404 as current vLLM, which serves only the routes of the model's task: for this model the API is absent."""
    return HTTPError(404, f"The model does not support the {api} API.")


def _overloaded(error: ScorekitError, api: str) -> HTTPError:
    message = f"The server is busy and cannot accept new requests ({error.message}). Please try again later."
    return HTTPError(503, message, headers=[_RETRY_AFTER])


def _not_ready(error: ScorekitError, api: str) -> HTTPError:
    return HTTPError(503, error.message, headers=[_RETRY_AFTER])


def _model_failure(error: ScorekitError, api: str) -> HTTPError:
    return HTTPError(500, error.message)


# Each error type and how it is answered; a subclass is answered as its nearest listed base.
ANSWERS: dict[type[ScorekitError], Callable[[ScorekitError, str], HTTPError]] = {
    InvalidRequest: _invalid,
    UnknownModel: _unknown_model,
    Unsupported: _unsupported,
    Overloaded: _overloaded,
    NotReady: _not_ready,
    ModelFailure: _model_failure,
}


def as_http_error(error: Exception, api: str) -> HTTPError | None:
    """The answer to ``error`` raised by the endpoint of the API named ``api`` ("Rerank"); None: not ours."""
    for kind in type(error).__mro__:
        answer = ANSWERS.get(kind)
        if answer is not None:
            assert isinstance(error, ScorekitError)
            return answer(error, api)
    return None


@dataclass(frozen=True, slots=True)
class Spelling:
    """The fields a route's body holds its inputs in: ``texts`` side 1's list (documents, texts, input),
    ``query`` side 0's field, a single text unless ``query_is_list`` (/score's ``queries``)."""

    texts: str
    query: str = "query"
    query_is_list: bool = False

    def name(self, places: tuple[Place, ...]) -> str:
        """The input at ``places`` as the body spells it; a second place is the text beside it in a pair."""
        named = [self._field(place) for place in places]
        return f"{named[0]} (with {named[1]})" if len(named) > 1 else named[0]

    def _field(self, place: Place) -> str:
        side, index = place
        if side == 0:
            return f"{self.query}[{index}]" if self.query_is_list else self.query
        return f"{self.texts}[{index}]"


@contextmanager
def spelled(spelling: Spelling) -> Iterator[None]:
    """An over-long input's error, raised inside, names the input as ``spelling`` has it ("documents[3] has ...")."""
    try:
        yield
    except InputTooLong as error:
        if not error.places:
            raise
        raise error.named(spelling.name(error.places)) from None
