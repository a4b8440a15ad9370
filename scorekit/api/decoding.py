"""How many bytes of request bodies are being decoded at once, bounded.

A large body is decoded in a worker thread so that the event loop keeps serving; but every such thread builds
its body's Python objects at the same time, and msgspec holds the GIL while it does, so forty of them side by
side finish no sooner than one after another, and hold forty bodies' worth of half-built objects at once (a
15 MB list of empty strings is 40 MB of list). :class:`DecodeBudget` lets bodies into their threads while the
bytes being decoded fit its limit, in arrival order; a body larger than the limit decodes alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio

# Two of the largest bodies the default --max-body-bytes (16 MiB) lets in, or many smaller ones: what 40 bodies of
# 15 MB at once then cost is in docs/benchmarks.md ("Bodies decoded at once").
DECODE_BYTES_AT_ONCE = 32 << 20


@dataclass(eq=False, slots=True)
class _Waiter:
    size: int
    admitted: anyio.Event = field(default_factory=anyio.Event)
    let_in: bool = False


class DecodeBudget:
    """A semaphore counted in bytes, for one event loop (each server's state has its own).

    ``async with budget.hold(size)`` waits until ``size`` more bytes fit ``limit``, or until nothing is held (so a
    body over the limit still decodes, alone). Waiters are let in first come, first served: a large body waits
    for room, and the small ones behind it wait for it, so it is never passed over for ever.
    """

    def __init__(self, limit: int = DECODE_BYTES_AT_ONCE) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: deque[_Waiter] = deque()

    @asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        if not self._waiting and self._fits(size):
            self.held += size
        else:
            waiter = _Waiter(size)
            self._waiting.append(waiter)
            try:
                await waiter.admitted.wait()
            except BaseException:  # cancelled while waiting (its client left)
                if waiter.let_in:  # let in at the same moment: give the room back
                    self._release(size)
                else:
                    self._waiting.remove(waiter)
                    self._let_in()  # it may have been first in line, holding the others back
                raise
        try:
            yield
        finally:
            self._release(size)

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.limit

    def _release(self, size: int) -> None:
        self.held -= size
        self._let_in()

    def _let_in(self) -> None:
        while self._waiting and self._fits(self._waiting[0].size):
            waiter = self._waiting.popleft()
            self.held += waiter.size
            waiter.let_in = True
            waiter.admitted.set()
