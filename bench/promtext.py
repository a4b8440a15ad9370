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


def total(found: dict[str, float], name: str) -> float:
    """A metric summed over its label sets (the per-model ones carry a ``model`` label)."""
    return sum(value for key, value in found.items() if key == name or key.startswith(name + "{"))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The engine's counters at one instant; subtract two to get what happened in between."""

    at: float
    batch_items: float
    batches: float
    inference_s: float
    dropped: float
    queue_depth: float
    route_load: float

    @classmethod
    def parse(cls, text: str, at: float, route: str = "/rerank") -> Snapshot:
        s = samples(text)
        return cls(
            at=at,
            batch_items=total(s, "scorekit_batch_size_sum"),
            batches=total(s, "scorekit_batch_size_count"),
            inference_s=total(s, "scorekit_inference_duration_seconds_sum"),
            dropped=total(s, "scorekit_items_dropped_total"),
            queue_depth=total(s, "scorekit_queue_depth"),
            route_load=s.get(f'scorekit_route_load{{route="{route}"}}', 0.0),
        )

    def minus(self, earlier: Snapshot) -> dict[str, float]:
        return {
            "seconds": self.at - earlier.at,
            "batch_items": self.batch_items - earlier.batch_items,
            "batches": self.batches - earlier.batches,
            "inference_s": self.inference_s - earlier.inference_s,
            "dropped": self.dropped - earlier.dropped,
        }
