"""Per-key quotas: requests and model inputs a minute, each a token bucket, refused with 429.

A bucket holds at most a minute's worth and refills continuously at its rate, so a key may spend its whole
minute at once after a quiet spell, and then one unit every ``60 / limit`` seconds. A request that finds too
little in a bucket takes nothing from it and is answered 429 with ``Retry-After`` (whole seconds until the
bucket will hold what it asked for) and the rate-limit fields of the IETF draft "RateLimit header fields for
HTTP" (draft-ietf-httpapi-ratelimit-headers-06): ``RateLimit-Limit`` (the bucket's size), ``RateLimit-Remaining``
(what it holds, whole units), ``RateLimit-Reset`` (seconds until it is full again) and ``RateLimit-Policy``
(``LIMIT;w=60``). A request the key's item quota can never hold (more model inputs than a minute's worth) is a
400 at once, not a 429 that would have it retried forever.

The buckets live in the process that serves the request: with ``--api-processes N``, each front end keeps its own
(docs/configuration.md). They are read and written on the event loop only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

from scorekit.http import HTTPError
from scorekit.settings import ApiKey
from scorekit.ticket import Ticket

WINDOW = 60.0  # seconds: the quotas are per minute
# The draft's fields, in the order an answer carries them.
RATE_LIMIT_HEADERS = ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "ratelimit-policy")


class TokenBucket:
    """``limit`` units a minute, refilled continuously, holding at most ``limit``."""

    def __init__(self, limit: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._rate = limit / WINDOW
        self._level = float(limit)
        self._clock = clock
        self._at = clock()

    def take(self, units: int) -> float:
        """Take ``units`` if the bucket holds them and answer 0; else take nothing and answer the seconds until it
        will hold them."""
        self._refill()
        if units <= self._level:
            self._level -= units
            return 0.0
        return (units - self._level) / self._rate

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The bucket as the draft's fields say it."""
        self._refill()
        reset = math.ceil((self.limit - self._level) / self._rate)
        values = (self.limit, math.floor(self._level), reset, f"{self.limit};w={WINDOW:g}")
        return [(name.encode(), str(value).encode()) for name, value in zip(RATE_LIMIT_HEADERS, values, strict=True)]

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.limit, self._level + (now - self._at) * self._rate)
        self._at = now


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

    def __init__(self, key: ApiKey, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = key.name or ""
        self.weight = key.weight
        self.requests = None if key.requests_per_minute is None else TokenBucket(key.requests_per_minute, clock=clock)
        self.items = None if key.items_per_minute is None else TokenBucket(key.items_per_minute, clock=clock)

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
