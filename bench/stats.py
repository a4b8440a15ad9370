"""Percentiles and latency summaries (no numpy: the load generator stays a light process)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default does; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean/max in milliseconds."""
    return summary([s * 1000 for s in seconds])


def summary(ms: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean/max of the values as given."""
    return {
        "n": float(len(ms)),
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "mean": sum(ms) / len(ms) if ms else float("nan"),
        "max": max(ms) if ms else float("nan"),
    }
