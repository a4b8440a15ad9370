"""A request's ticket: where its model work goes in the queue, and what that work cost.

One :class:`Ticket` per HTTP request, the current one while the request runs (a context variable, as the log
record of ``logs.py`` is). The usage middleware opens it; the API-key gate writes the request's key on it (its
fair-share name and weight, its item quota, the rate-limit headers to answer with); the endpoint's decode
writes the body's ``priority`` and the ``X-Request-Timeout`` deadline; the engine reads it when it queues the
request's work and adds what that work cost in model seconds, which the usage middleware then sends back as a
header. Outside a request (an engine called directly) a fresh ticket with the defaults stands in, so nothing
below the endpoints needs one.

A leaf module: no torch, nothing of HTTP.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class Ticket:
    """One request's schedule and cost.

    ``key`` and ``weight``: the fair-share key its work draws on ("" and 1 when the server asks no API key).
    ``priority``: vLLM's field, lower runs earlier. ``deadline``: the ``time.monotonic()`` reading past which none
    of its work may start (None: only ``max_queue_wait`` limits it), given as ``timeout`` seconds. ``quota``:
    takes the request's model inputs from its key's item quota, raising the answer when they are not there.
    ``headers``: the rate-limit headers its answer carries. ``model_seconds``: what its work cost on the model
    (its share of every batch its items rode in), None until some of it was queued."""

    key: str = ""
    weight: float = 1.0
    priority: int = 0
    deadline: float | None = None
    timeout: float | None = None
    quota: Callable[[int], None] | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    model_seconds: float | None = None

    def add_model_seconds(self, seconds: float) -> None:
        self.model_seconds = (self.model_seconds or 0.0) + seconds


_CURRENT: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("scorekit_ticket", default=None)


@contextmanager
def opened(ticket: Ticket) -> Iterator[Ticket]:
    """``ticket`` is the current request's for the block."""
    token = _CURRENT.set(ticket)
    try:
        yield ticket
    finally:
        _CURRENT.reset(token)


def current_ticket() -> Ticket:
    """The ticket of the request being served; outside one, a fresh ticket with the defaults (kept nowhere)."""
    ticket = _CURRENT.get()
    return Ticket() if ticket is None else ticket
