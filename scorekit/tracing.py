"""OpenTelemetry traces of the requests: where each request spent its time, exported over OTLP.

Off by default. On (``--otlp-traces-endpoint``, or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), the app keeps a
:class:`Tracing` of its own, a TracerProvider that is never the process's global one (an app that embeds scorekit
may own that), exporting in batches over OTLP/gRPC or OTLP/HTTP (protobuf) with the official exporters (the
``otel`` extra, imported only then). The ``OTEL_*`` variables the SDK reads stay in force: the exporter's headers,
timeout, compression and certificates, the sampler (``OTEL_TRACES_SAMPLER``), the resource's attributes.

Each HTTP request gets one span (``middleware/tracing.py`` opens it, continuing the client's W3C ``traceparent``),
the current :class:`RequestTrace` while the request runs, a context variable as the request's ticket is. The layers
below add to it where the work happens: ``decode`` (the body into its Struct), ``tokenize``, ``queue`` (from the
request's job being queued to its first batch), one ``batch`` span per batch its items rode in (each linking the
span of every traced request in that batch: a batch serves several requests and can have only one parent) and
``encode`` (the answer into JSON). A client that leaves and the queued work dropped are events on the request's
span. Off, each of those places finds no current trace and does nothing else: :func:`span` hands back one shared
no-op, and the engine marks no job (the batch timings a traced job collects are not taken).

A leaf module: no torch; opentelemetry only once tracing is on.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from scorekit import __version__
from scorekit.jobs import BatchRun, TraceRef

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from scorekit.settings import Settings

TraceProtocol = Literal["grpc", "http/protobuf"]
# Exceptions a stage raises for the request's own fault (a 4xx): its span is not marked as an error for them.
ClientErrors = tuple[type[Exception], ...]
PROTOCOLS: tuple[TraceProtocol, ...] = get_args(TraceProtocol)
DEFAULT_PROTOCOL: TraceProtocol = "grpc"  # vLLM's and TEI's
DEFAULT_SERVICE_NAME = "scorekit"
# Where an OTLP/HTTP collector takes traces, added to an endpoint given without a path.
HTTP_TRACES_PATH = "/v1/traces"
# The variables that name the trace exporter's endpoint and protocol (the traces' own first), and the SDK's off switch.
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
DISABLED_VARIABLE = "OTEL_SDK_DISABLED"
SERVICE_NAME_VARIABLE = "OTEL_SERVICE_NAME"
INSTALL_HINT = "pip install 'scorekit[otel]'"
# The longest the end of a lifespan waits for the last spans to be exported.
FLUSH_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """Where the traces go: the collector's URL as the exporter takes it, the protocol, and the service name."""

    endpoint: str
    protocol: TraceProtocol
    service_name: str

    @classmethod
    def resolve(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> TraceConfig | None:
        """The settings' tracing over the ``OTEL_*`` variables (None: off). A setting wins over its variable;
        ``OTEL_SDK_DISABLED=true`` turns tracing off altogether. A bad value is a ValueError in one line."""
        env = os.environ if environ is None else environ
        if env.get(DISABLED_VARIABLE, "").strip().lower() == "true":
            return None
        endpoint = settings.otlp_traces_endpoint or env.get(ENDPOINT_VARIABLE, "").strip() or None
        if endpoint is None:
            return None
        protocol: str = settings.otlp_traces_protocol or DEFAULT_PROTOCOL
        if settings.otlp_traces_protocol is None:
            variable = next((name for name in PROTOCOL_VARIABLES if env.get(name, "").strip()), None)
            if variable is not None and (protocol := env[variable].strip()) not in PROTOCOLS:
                raise ValueError(f"{variable} must be {' or '.join(PROTOCOLS)}, not {protocol!r}")
        name = settings.otlp_service_name or env.get(SERVICE_NAME_VARIABLE, "").strip() or DEFAULT_SERVICE_NAME
        if not settings.otlp_traces_endpoint:  # the settings' own is checked when they are made
            try:
                check_endpoint(endpoint)
            except ValueError as exc:
                raise ValueError(f"{ENDPOINT_VARIABLE}: {exc}") from None
        chosen = PROTOCOLS[PROTOCOLS.index(protocol)]  # checked above: the literal it is
        return cls(exporter_endpoint(endpoint, chosen), chosen, name)


def check_endpoint(url: str) -> str:
    """``url`` when it is an http:// or https:// URL with a host, else a ValueError saying so (its caller names
    where the URL came from)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or url != url.strip():
        raise ValueError(f"expected the collector's http:// or https:// URL, not {url!r}")
    return url


def exporter_endpoint(url: str, protocol: TraceProtocol) -> str:
    """The URL as the exporter of ``protocol`` takes it: an OTLP/HTTP endpoint given without a path gets the
    collector's traces path (``http://collector:4318`` posts to ``/v1/traces``, as the OTLP specification has it
    for the general endpoint); gRPC takes the host and port."""
    parts = urlsplit(url)
    if protocol == "http/protobuf" and parts.path in ("", "/"):
        return urlunsplit(parts._replace(path=HTTP_TRACES_PATH))
    return url


def check_installed() -> None:
    """A ValueError in one line when the ``otel`` extra is missing: said before any model loads."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ValueError(f"traces need OpenTelemetry's SDK and exporters: {INSTALL_HINT}") from None


class Tracing:
    """One app's traces: its TracerProvider with a batch span processor exporting over OTLP, and the W3C trace
    context of the requests."""

    def __init__(self, config: TraceConfig) -> None:
        check_installed()
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.config = config
        resource = Resource.create({"service.name": config.service_name, "service.version": __version__})
        self.provider: TracerProvider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(_exporter(config)))
        self.tracer: Tracer = self.provider.get_tracer("scorekit", __version__)
        self._propagator = TraceContextTextMapPropagator()

    def parent(self, headers: Mapping[str, str]) -> Context:
        """The context a request's span continues: the client's ``traceparent`` (and ``tracestate``), or none."""
        return self._propagator.extract(headers)

    def flush(self) -> None:
        """Export every span ended so far (at most :data:`FLUSH_SECONDS`): at the end of the app's lifespan. The
        provider shuts down when the process exits."""
        self.provider.force_flush(int(FLUSH_SECONDS * 1000))


def _exporter(config: TraceConfig) -> Any:
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=config.endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=config.endpoint)


class RequestTrace:
    """One request's span, the current one while the request runs: what the layers below add their spans and
    events to. ``ref`` names the span in a job (:data:`~scorekit.jobs.TraceRef`), so a batch can link it; None when
    the span is not sampled, and then nothing below records anything."""

    __slots__ = ("context", "ref", "span", "tracer")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        from opentelemetry.trace import set_span_in_context

        self.tracer = tracer
        self.span = span
        self.context = set_span_in_context(span)
        context = span.get_span_context()
        self.ref: TraceRef | None = _ref(context.trace_id, context.span_id) if span.is_recording() else None

    @contextmanager
    def child(
        self, name: str, attributes: Mapping[str, Any] | None = None, client_errors: ClientErrors = ()
    ) -> Iterator[Any]:
        """A child span for the block. An exception that escapes it marks the span's status as an error, unless it
        is one of ``client_errors``: the request's own fault, answered 4xx, as the request's span leaves it unset."""
        from opentelemetry.trace import Status, StatusCode, use_span

        child = self.tracer.start_span(name, context=self.context, attributes=attributes)
        with use_span(child, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                yield child
            except Exception as exc:
                if not isinstance(exc, client_errors):
                    child.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self.span.add_event(name, attributes=attributes)

    def note(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes(attributes)

    def job(self, submitted_ns: int, ended_ns: int, runs: Iterable[BatchRun], attributes: Mapping[str, Any]) -> None:
        """The spans of one job that ran on the model, from its timings: ``queue`` from ``submitted_ns`` to its
        first batch (or to ``ended_ns`` when none ran), then one ``batch`` span per batch its items rode in, each
        linked to the span of every traced request in that batch."""
        from opentelemetry.trace import Link, SpanContext, TraceFlags

        runs = list(runs)
        queue = self.tracer.start_span("queue", context=self.context, attributes=attributes, start_time=submitted_ns)
        # Its first batch: with several worker threads, a later note can be of an earlier batch.
        queue.end(end_time=min(run.started_ns for run in runs) if runs else max(ended_ns, submitted_ns))
        for run in runs:
            links = [
                Link(SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
                for trace_id, span_id in map(_ids, run.peers)
            ]
            batch = self.tracer.start_span(
                "batch",
                context=self.context,
                links=links,
                start_time=run.started_ns,
                attributes={
                    "scorekit.batch.items": run.items,
                    "scorekit.batch.padded_tokens": run.padded_tokens,
                    "scorekit.batch.requests": len(run.peers),
                    "scorekit.batch.own_items": run.own_items,
                },
            )
            if run.failed:
                from opentelemetry.trace import Status, StatusCode

                batch.set_status(Status(StatusCode.ERROR, "the model failed on this batch"))
            batch.end(end_time=run.ended_ns)


_CURRENT: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("scorekit_trace", default=None)
_OFF: AbstractContextManager[None] = nullcontext()


def current() -> RequestTrace | None:
    """The trace of the request being served; None when tracing is off, outside a request, or not sampled."""
    return _CURRENT.get()


def opened(trace: RequestTrace) -> contextvars.Token[RequestTrace | None]:
    """``trace`` is the current request's until :func:`closed` is given the token back."""
    return _CURRENT.set(trace)


def closed(token: contextvars.Token[RequestTrace | None]) -> None:
    _CURRENT.reset(token)


def span(
    name: str, attributes: Mapping[str, Any] | None = None, client_errors: ClientErrors = ()
) -> AbstractContextManager[Any]:
    """A child span of the current request's for the block (``client_errors`` as :meth:`RequestTrace.child` takes
    them); with no current trace, a shared no-op."""
    trace = _CURRENT.get()
    if trace is None or trace.ref is None:
        return _OFF
    return trace.child(name, attributes, client_errors)


def event(name: str, attributes: Mapping[str, Any] | None = None) -> None:
    """An event on the current request's span (none: nothing)."""
    trace = _CURRENT.get()
    if trace is not None and trace.ref is not None:
        trace.event(name, attributes)


def now_ns() -> int:
    """The wall clock spans are timed by (the model host process's batches too: one machine, one clock)."""
    return time.time_ns()


def _ref(trace_id: int, span_id: int) -> TraceRef:
    return trace_id.to_bytes(16, "big") + span_id.to_bytes(8, "big")


def _ids(ref: TraceRef) -> tuple[int, int]:
    return int.from_bytes(ref[:16], "big"), int.from_bytes(ref[16:], "big")
