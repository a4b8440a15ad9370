"""The server load counter: requests in flight, in total and per route.

One shared object per app. Every change is a plain synchronous statement, so a cancelled
task can never skip one (an ``await`` in a ``finally`` could be cancelled again).
"""

from __future__ import annotations

from collections import Counter


class LoadCounter:
    """Counts requests that are inside an owner lifecycle layer right now."""

    def __init__(self) -> None:
        self._total = 0
        self._per_route: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return self._total

    @property
    def routed(self) -> int:
        """Requests in flight on routes that count as load (scoring, not /load or /health)."""
        return sum(self._per_route.values())

    def per_route(self) -> dict[str, int]:
        """A snapshot, so a reader never sees a dict that changes under it."""
        return {route: n for route, n in self._per_route.items() if n}

    def enter(self) -> None:
        self._total += 1

    def exit(self) -> None:
        self._total -= 1

    def enter_route(self, route: str) -> None:
        self._per_route[route] += 1

    def exit_route(self, route: str) -> None:
        self._per_route[route] -= 1
