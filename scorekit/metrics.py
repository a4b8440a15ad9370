"""Prometheus metrics, one registry per app (so several apps can live in one process), or over every front-end
process of one server (``--api-processes``).

prometheus-client gives the text format, histograms and thread-safe counters for free; the load
and the queue depth are read at scrape time from their owners, so they are never stale copies.
What belongs to one model (its batches, queue, dropped items, admitted requests, where its requests' time
goes, and the requests it rejected, lost to their clients or failed) carries a ``model`` label; each engine
reports to its model's :class:`ModelMetrics`. The split of a request's time into tokenizing, queue wait and
inference follows text-embeddings-inference, so its dashboards and autoscaling rules carry over.

Beside scorekit's own series are vLLM's (``vllm:``, labelled ``model_name``) where a scoring server has the same
quantity, so a dashboard or an autoscaler written for vLLM reads scorekit unchanged: the requests running and
waiting, the requests that succeeded, and their end-to-end and queue times (docs/deployment.md lists them).

With several front-end processes a scrape reaches one of them, and must answer for all: the counters and
histograms are then written by prometheus-client's multiprocess mode (a file per process in one directory) and a
scrape sums every process's files, while the live gauges are read once, by the process scraped, from owners that
already count over every front end (the load board of ``scorekit.load``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from scorekit.asgi import Scope
from scorekit.load import LoadCounter
from scorekit.logs import RequestRecord

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_POWERS_OF_TWO = tuple(float(2**i) for i in range(11))
# From half a millisecond (tokenizing one short pair) to a minute (a deep queue on a slow model).
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True, slots=True)
class ModelGauge:
    """One served model's live numbers, read at scrape time."""

    name: str
    queued_items: int
    queued_tokens: int
    admitted: int
    waiting: int = 0  # requests queued, none of whose items has run yet
    running: int = 0  # requests with a batch run or running, not yet answered


ModelGauges = Callable[[], Iterable[ModelGauge]]


class Metrics:
    """One app's metrics. ``registry`` holds what this process counted; :meth:`render` is what a scrape answers.

    With ``processes``, the prometheus-client multiprocess directory every front end of the server writes to
    (``PROMETHEUS_MULTIPROC_DIR``, set to it before prometheus-client was imported, and empty when the server
    started), a scrape answers the sum over every process that has counted since, those gone included, as
    counters must; make one such ``Metrics`` per process (two would count into the same file)."""

    def __init__(self, load: LoadCounter, models: ModelGauges, processes: Path | None = None) -> None:
        if processes is not None:
            _check_multiprocess(processes)
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
        self.tokenize = self._seconds("scorekit_tokenize_duration_seconds", "Time a request spent tokenizing.")
        self.queue_wait = self._seconds(
            "scorekit_queue_duration_seconds", "Time from a request's queueing to its first item running."
        )
        self.inference = self._seconds("scorekit_inference_duration_seconds", "Forward time per model batch.")
        self.rejected = self._by_model(
            "scorekit_requests_rejected", "Requests refused before any of their work ran, by reason.", "reason"
        )
        self.cancelled = self._by_model(
            "scorekit_requests_cancelled", "Requests whose client left, by the stage they were in.", "stage"
        )
        self.failed = self._by_model("scorekit_requests_failed", "Requests the model failed, by reason.", "reason")
        self.model_seconds = self._by_model(
            "scorekit_model_seconds",
            "Model seconds the requests of each API key used: their share of every batch's forward time, by tokens.",
            "key",
        )
        # vLLM's names, where a scoring server has the same quantity (its label is model_name).
        self.vllm_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.vllm_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            ["model_name"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.vllm_queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            ["model_name"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        live = _LiveGauges(load, models)
        if processes is None:
            self.registry.register(live)
            self._scraped = self.registry
        else:
            # A registry of its own: the counters are read from the files alone, never twice.
            self._scraped = CollectorRegistry()
            MultiProcessCollector(self._scraped, path=str(processes))  # type: ignore[no-untyped-call]
            self._scraped.register(live)

    def _seconds(self, name: str, text: str) -> Histogram:
        return Histogram(name, text, ["model"], buckets=_SECONDS, registry=self.registry)

    def _by_model(self, name: str, text: str, why: str) -> Counter:
        return Counter(name, text, ["model", why], registry=self.registry)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def request_ended(self, scope: Scope, record: RequestRecord, status: int, seconds: float) -> None:
        """A request answered (a :data:`~scorekit.middleware.metrics.RequestEnd`): one that a served model answered
        with success is vLLM's finished request, "stop" its reason (a scoring request runs to its end), and its time
        to the last byte vLLM's end-to-end latency."""
        if record.model is not None and 200 <= status < 300:
            self.vllm_success.labels(record.model, "stop").inc()
            self.vllm_e2e.labels(record.model).observe(seconds)

    def model(self, name: str) -> ModelMetrics:
        """What one model's engine reports to (an ``EngineObserver``)."""
        return ModelMetrics(self, name)

    def render(self) -> bytes:
        return generate_latest(self._scraped)


def _check_multiprocess(processes: Path) -> None:
    """Refuse a ``processes`` directory that prometheus-client is not writing to: its counters would stay in
    this process, and a scrape would answer one front end's share as the server's."""
    named = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not named or not Path(named).is_dir() or not processes.is_dir() or not Path(named).samefile(processes):
        raise ValueError(
            f"metrics over processes need PROMETHEUS_MULTIPROC_DIR set to the directory {str(processes)!r}"
            f" (it is {named!r}) before prometheus_client is imported"
        )
    if not getattr(values.ValueClass, "_multiprocess", False):
        raise ValueError(
            "prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set: its counters stay in this process"
        )


class ModelMetrics:
    """One model's view of the metrics: the engine's observer, labelling everything with the model's name."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._metrics = metrics
        self._model = model

    def batch(self, size: int, tokens: int, seconds: float) -> None:
        self._metrics.batch_size.labels(self._model).observe(size)
        self._metrics.batch_tokens.labels(self._model).observe(tokens)
        self._metrics.inference.labels(self._model).observe(seconds)

    def dropped(self, items: int) -> None:
        self._metrics.dropped.labels(self._model).inc(items)

    def tokenized(self, seconds: float) -> None:
        self._metrics.tokenize.labels(self._model).observe(seconds)

    def waited(self, seconds: float) -> None:
        self._metrics.queue_wait.labels(self._model).observe(seconds)
        self._metrics.vllm_queue.labels(self._model).observe(seconds)

    def rejected(self, reason: str) -> None:
        self._metrics.rejected.labels(self._model, reason).inc()

    def cancelled(self, stage: str) -> None:
        self._metrics.cancelled.labels(self._model, stage).inc()

    def failed(self, reason: str) -> None:
        self._metrics.failed.labels(self._model, reason).inc()

    def model_seconds(self, key: str, seconds: float) -> None:
        self._metrics.model_seconds.labels(self._model, key).inc(seconds)


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
        tokens = GaugeMetricFamily(
            "scorekit_queue_tokens", "Tokens of the items waiting for the model (unpadded).", labels=["model"]
        )
        admitted = GaugeMetricFamily(
            "scorekit_model_requests", "Requests admitted to the model's engine.", labels=["model"]
        )
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=["model_name"]
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=["model_name"]
        )
        for model in self._models():
            queue.add_metric([model.name], model.queued_items)
            tokens.add_metric([model.name], model.queued_tokens)
            admitted.add_metric([model.name], model.admitted)
            running.add_metric([model.name], model.running)
            waiting.add_metric([model.name], model.waiting)
        yield from (total, per_route, queue, tokens, admitted, running, waiting)
