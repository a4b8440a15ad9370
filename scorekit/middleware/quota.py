"""Per-key quotas: requests and model inputs a minute, each a token bucket, refused with 429.

A bucket holds at most a minute's worth and refills continuously at its rate, so a key may spend its whole
minute at once after a quiet spell, and then one unit every ``60 / limit`` seconds. A request that finds too
little in a bucket takes nothing from it and is answered 429 with ``Retry-After`` (whole seconds until the
bucket will hold what it asked for) and the rate-limit fields of the IETF draft "RateLimit header fields for
HTTP" (draft-ietf-httpapi-ratelimit-headers-06): ``RateLimit-Limit`` (the bucket's size), ``RateLimit-Remaining``
(what it holds, whole units), ``RateLimit-Reset`` (seconds until it is full again) and ``RateLimit-Policy``
(``LIMIT;w=60``). A request the key's item quota can never hold (more model inputs than a minute's worth) is a
400 at once, not a 429 that would have it retried forever.

A bucket is kept as the one time it will be full again (the generic cell rate algorithm's form of a token bucket):
a take moves that time on by the units' refill time, and is refused when it would move past a minute from now.
With ``--api-processes N`` that time is a word on the front ends' shared board (``load.Board.shared``), read and
moved under the board's lock, so a key's quota holds over every front end together, whichever its connections
reach; in one process it is a float. Either way it is read and written on the event loop only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Protocol

from scorekit.http import HTTPError
from scorekit.load import Board
from scorekit.settings import ApiKey
from scorekit.ticket import Ticket

WINDOW = 60.0  # seconds: the quotas are per minute
# Rounding slack on "a minute's worth": n takes of 60/n seconds each add up to 60 s give or take a float's last bit.
_SLACK = 1e-6
# The draft's fields, in the order an answer carries them.
RATE_LIMIT_HEADERS = ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "ratelimit-policy")


class BucketState(Protocol):
    """Where a bucket keeps the time (on the clock it is given) at which it is full again."""

    def held(self) -> AbstractContextManager[object]:
        """Held around a read and the write that follows it."""
        ...

    def read(self) -> float: ...

    def write(self, full_at: float) -> None: ...


class LocalState:
    """A bucket of this process alone."""

    def __init__(self) -> None:
        self._full_at = 0.0  # long past: a new bucket is full

    def held(self) -> AbstractContextManager[object]:
        return nullcontext()

    def read(self) -> float:
        return self._full_at

    def write(self, full_at: float) -> None:
        self._full_at = full_at


class SharedState:
    """A bucket every front end of a server takes from: a word of nanoseconds on their board, under its lock."""

    def __init__(self, board: Board, name: str) -> None:
        self._board = board
        self._word = board.shared(name)

    def held(self) -> AbstractContextManager[object]:
        return self._board.locked()

    def read(self) -> float:
        return self._word.value / 1e9

    def write(self, full_at: float) -> None:
        self._word.value = round(full_at * 1e9)


class TokenBucket:
    """``limit`` units a minute, refilled continuously, holding at most ``limit``."""

    def __init__(
        self, limit: int, *, clock: Callable[[], float] = time.monotonic, state: BucketState | None = None
    ) -> None:
        self.limit = limit
        self._refill_seconds = WINDOW / limit  # one unit's
        self._clock = clock
        self._state: BucketState = LocalState() if state is None else state

    def take(self, units: int) -> float:
        """Take ``units`` if the bucket holds them and answer 0; else take nothing and answer the seconds until it
        will hold them."""
        with self._state.held():
            now = self._clock()
            full_at = max(self._state.read(), now) + units * self._refill_seconds
            if full_at - now <= WINDOW + _SLACK:
                self._state.write(full_at)
                return 0.0
            return full_at - now - WINDOW

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The bucket as the draft's fields say it."""
        with self._state.held():
            full_at = self._state.read()
        until_full = max(full_at - self._clock(), 0.0)
        level = max((WINDOW - until_full) / self._refill_seconds, 0.0)
        values = (self.limit, math.floor(level + _SLACK), math.ceil(until_full - _SLACK), f"{self.limit};w={WINDOW:g}")
        return [(name.encode(), str(value).encode()) for name, value in zip(RATE_LIMIT_HEADERS, values, strict=True)]


def too_many(bucket: TokenBucket, wait: float, what: str) -> HTTPError:
    """The 429 for a request that found ``bucket`` short by ``wait`` seconds of refill."""
    retry = max(math.ceil(wait), 1)
    return HTTPError(
        429,
        f"This API key's quota of {bucket.limit} {what} a minute is spent; retry in {retry} s.",
        headers=[(b"retry-after", str(retry).encode()), *bucket.headers()],
    )


def never_fits(bucket: TokenBucket, units: int) -> HTTPError:
    """The 400 for a request larger than its key's whole item quota."""
    return HTTPError(
        400,
        f"This request needs {units} model inputs, more than this API key's quota of {bucket.limit} a minute "
        "holds; send it as several smaller requests.",
    )


class KeyQuotas:
    """One API key's part in scheduling: its name and weight, which a request of it writes on its ticket, and its
    quota buckets (requests, taken at the gate; model inputs, taken by the engine when it admits the request)."""

    def __init__(
        self, key: ApiKey, *, place: int = 0, board: Board | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``place`` is the key's among the server's keys (every front end has them in one order): with a
        ``board``, its buckets are the board's words of that place."""
        self.name = key.name or ""
        self.weight = key.weight

        def bucket(limit: int | None, what: str) -> TokenBucket | None:
            if limit is None:
                return None
            state = None if board is None else SharedState(board, f"quota:{what}:{place}")
            return TokenBucket(limit, clock=clock, state=state)

        self.requests = bucket(key.requests_per_minute, "requests")
        self.items = bucket(key.items_per_minute, "items")

    def admit(self, ticket: Ticket) -> HTTPError | None:
        """A request of this key: its ticket named for the key and one request taken from its quota; the answer
        that refuses it, or None."""
        ticket.key, ticket.weight = self.name, self.weight
        if self.requests is not None:
            if wait := self.requests.take(1):
                return too_many(self.requests, wait, "requests")
            ticket.headers = self.requests.headers()
        if self.items is not None:
            ticket.quota = partial(self._take_items, self.items, ticket)
        return None

    def _take_items(self, bucket: TokenBucket, ticket: Ticket, units: int) -> None:
        """The engine admits ``units`` model inputs of the ticket's request: taken, or the answer raised. The
        headers describe the requests quota when the key has one, else this one; a refusal carries its own."""
        if units > bucket.limit:
            ticket.headers = []
            raise never_fits(bucket, units)
        if wait := bucket.take(units):
            ticket.headers = []
            raise too_many(bucket, wait, "model inputs")
        if self.requests is None:
            ticket.headers = bucket.headers()
