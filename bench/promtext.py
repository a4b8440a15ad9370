"""Read the few scorekit /metrics samples the scenarios need out of the Prometheus text format."""

from __future__ import annotations

from dataclasses import dataclass


def samples(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line (comments skipped)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        found[key] = float(value)
    return found


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The engine's counters at one instant; subtract two to get what happened in between."""

    at: float
    batch_items: float
    batches: float
    dropped: float
    queue_depth: float
    route_load: float

    @classmethod
    def parse(cls, text: str, at: float, route: str = "/rerank") -> Snapshot:
        s = samples(text)
        return cls(
            at=at,
            batch_items=s.get("scorekit_batch_size_sum", 0.0),
            batches=s.get("scorekit_batch_size_count", 0.0),
            dropped=s.get("scorekit_items_dropped_total", 0.0),
            queue_depth=s.get("scorekit_queue_depth", 0.0),
            route_load=s.get(f'scorekit_route_load{{route="{route}"}}', 0.0),
        )

    def minus(self, earlier: Snapshot) -> dict[str, float]:
        return {
            "seconds": self.at - earlier.at,
            "batch_items": self.batch_items - earlier.batch_items,
            "batches": self.batches - earlier.batches,
            "dropped": self.dropped - earlier.dropped,
        }
