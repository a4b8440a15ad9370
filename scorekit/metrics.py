"""Prometheus metrics, one registry per app (so several apps can live in one process).

prometheus-client gives the text format, histograms and thread-safe counters for free; the load
and the queue depth are read at scrape time from their owners, so they are never stale copies.
What belongs to one model (its batches, queue, dropped items, admitted requests) carries a ``model`` label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scorekit.load import LoadCounter

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_POWERS_OF_TWO = tuple(float(2**i) for i in range(11))


# Per served model at scrape time: (name, items queued, requests admitted to its engine).
ModelGauges = Callable[[], Iterable[tuple[str, int, int]]]


class Metrics:
    def __init__(self, load: LoadCounter, models: ModelGauges) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "scorekit_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "scorekit_request_duration_seconds",
            "Time from routing to response.",
            ["route"],
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "scorekit_batch_size", "Items per model batch.", ["model"], buckets=_POWERS_OF_TWO, registry=self.registry
        )
        self.batch_tokens = Histogram(
            "scorekit_batch_tokens",
            "Padded tokens per model batch.",
            ["model"],
            buckets=tuple(64.0 * 2**i for i in range(12)),
            registry=self.registry,
        )
        self.dropped = Counter(
            "scorekit_items_dropped",
            "Queued items dropped before they ran because their client disconnected.",
            ["model"],
            registry=self.registry,
        )
        self.registry.register(_LiveGauges(load, models))

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_batch(self, model: str, size: int, tokens: int) -> None:
        self.batch_size.labels(model).observe(size)
        self.batch_tokens.labels(model).observe(tokens)

    def observe_dropped(self, model: str, items: int) -> None:
        self.dropped.labels(model).inc(items)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LiveGauges(Collector):
    def __init__(self, load: LoadCounter, models: ModelGauges) -> None:
        self._load = load
        self._models = models

    def collect(self) -> Iterator[Metric]:
        total = GaugeMetricFamily("scorekit_load", "Requests in flight.")
        total.add_metric([], self._load.total)
        per_route = GaugeMetricFamily("scorekit_route_load", "Requests in flight per route.", labels=["route"])
        for route, n in sorted(self._load.per_route().items()):
            per_route.add_metric([route], n)
        queue = GaugeMetricFamily("scorekit_queue_depth", "Items waiting for the model.", labels=["model"])
        admitted = GaugeMetricFamily(
            "scorekit_model_requests", "Requests admitted to the model's engine.", labels=["model"]
        )
        for model, queued, active in self._models():
            queue.add_metric([model], queued)
            admitted.add_metric([model], active)
        yield from (total, per_route, queue, admitted)
