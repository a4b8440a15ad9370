"""scorekit's one error hierarchy: what the engine and the backends refuse, by kind, with no HTTP in it.

A leaf module. ``api/errors.py`` is the one table from these types to an HTTP status and the error shape;
anything else that escapes an endpoint (a backend's bug included) is a 500, never a 400.
"""

from __future__ import annotations


class ScorekitError(Exception):
    """Base of every error scorekit raises on purpose while serving a request."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(ScorekitError, ValueError):
    """The request asks for something this model cannot do; ``param`` names the field when one is to blame.
    A ValueError too, so code that checks inputs the Python way still catches it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# Where an input is in the request: (side, index). Side 0 is a pair's query side, side 1 its documents, or
# the texts of an embedding request; the route names a place as its body spells it ("documents[3]").
Place = tuple[int, int]


class InputTooLong(InvalidRequest):
    """An input is over the model's maximum length and the request asked for no truncation.

    ``index`` is the input's position in what the backend was given, and ``places`` where it is in the
    request: the text to blame, and for a pair the other text beside it (the backend's plan finds them). The
    route names them in the message as the request spelled them (e.g. ``documents[3] (with query)``);
    ``param`` is vLLM's ``input_tokens``. ``length`` is its token count; None when its ``chars`` alone rule
    it out, before tokenizing.
    """

    def __init__(
        self,
        index: int,
        length: int | None,
        maximum: int,
        *,
        chars: int = 0,
        places: tuple[Place, ...] = (),
        name: str | None = None,
    ) -> None:
        self.index = index
        self.length = length
        self.chars = chars
        self.maximum = maximum
        self.places = places
        name = name or f"Input {index}"
        size = f"{length} tokens" if length is not None else f"{chars} characters"
        super().__init__(
            f"{name} has {size}, but the model's maximum length is {maximum} tokens. "
            "Please reduce the length of the input prompt, or set truncate_prompt_tokens.",
            # vLLM's param for a context-length error: gateways recognise the error by it.
            "input_tokens",
        )

    # Which text of a pair the error is about (0 the first, 1 the second), or None for the whole input.
    part: int | None = None

    def at(self, places: tuple[Place, ...]) -> InputTooLong:
        """The same error, found at ``places`` of the request."""
        return self._remade(places, None)

    def named(self, name: str) -> InputTooLong:
        """The same error, its message naming the input as the request spelled it."""
        return self._remade(self.places, name)

    def _remade(self, places: tuple[Place, ...], name: str | None) -> InputTooLong:
        return InputTooLong(self.index, self.length, self.maximum, chars=self.chars, places=places, name=name)


class NoRoomForDocument(InputTooLong):
    """Scoring a long document by windows, the query (pair ``index``'s first text) and the special tokens
    leave no room for one token of the document: refused, never cut into empty windows. ``length`` is the
    query's token count (None when it was tokenized only as deep as the model's length)."""

    part = 0

    def __init__(
        self,
        index: int,
        length: int | None,
        specials: int | None,
        maximum: int,
        *,
        places: tuple[Place, ...] = (),
        name: str | None = None,
    ) -> None:
        """``specials``: the special tokens a pair adds, or None for an LLM reranker's prompt around the query."""
        self.specials = specials
        super().__init__(index, length, maximum, places=places, name=name)
        size = f"{length} tokens" if length is not None else f"more than {maximum} tokens"
        beside = "the reranker's prompt" if specials is None else f"the model's {specials} special tokens"
        self.message = (
            f"{name or f'Input {index}'} has {size}, which with {beside} leaves no "
            f"room for a document token in its maximum length of {maximum} tokens. "
            "Shorten the query, or cut it with max_tokens_per_query."
        )
        self.args = (self.message,)

    def _remade(self, places: tuple[Place, ...], name: str | None) -> NoRoomForDocument:
        return NoRoomForDocument(self.index, self.length, self.specials, self.maximum, places=places, name=name)


class TruncationTooLarge(InvalidRequest):
    """``truncate_prompt_tokens`` asks for more tokens than the model takes (the message is vLLM's)."""

    def __init__(self) -> None:
        super().__init__(
            "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.",
            "truncate_prompt_tokens",
        )


class UnknownModel(ScorekitError):
    """The request names a model this server does not serve."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")


class Unsupported(ScorekitError):
    """The model has no capability for this task (a causal LM asked to rerank)."""


class Overloaded(ScorekitError):
    """Admission refused (queue or concurrency limit): retry later."""


class QueueTimeout(Overloaded):
    """The request waited longer than ``max_queue_wait`` before any of its work ran, and was taken out of the
    queue: answered as :class:`Overloaded` (503, retry later), since a queue that deep is the server's load."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"this request waited more than {limit:g} s in the queue before any of it ran")


class NotReady(ScorekitError):
    """The model is not loaded yet, or its worker died: retry later (another replica may answer)."""


class ModelFailure(ScorekitError):
    """The model raised on the batch that held this request's items."""


class WorkerDied(ModelFailure):
    """The model worker thread died: this request, and every one queued with it, cannot run. Answered as a
    :class:`ModelFailure`; its own type lets the metrics tell a dead worker from one failed batch."""
