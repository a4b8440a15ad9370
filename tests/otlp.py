"""A real OTLP trace receiver on a free loopback port, for the tests of scorekit's tracing.

The tracing tests export with the official OpenTelemetry SDK and its OTLP exporters, so what they check is what a
collector would get: the spans go over the wire and are decoded here from ``ExportTraceServiceRequest``. One receiver
speaks one protocol, as a collector's receiver does:

- ``"grpc"``: a ``grpc.server`` serving the generated ``TraceService``; the exporter's endpoint is
  ``http://127.0.0.1:PORT`` (``http`` makes the gRPC exporter use an insecure channel);
- ``"http/protobuf"``: a stdlib ``ThreadingHTTPServer`` taking ``POST /v1/traces`` (``application/x-protobuf``,
  plain or with ``Content-Encoding: gzip`` or ``deflate``); the exporter's endpoint is
  ``http://127.0.0.1:PORT/v1/traces``. Another path answers 404, another content type or encoding 415, a body that
  does not decode 400.

Every span becomes a plain :class:`Span`. Trace and span ids are lower-case hex strings as W3C ``traceparent`` writes
them (32 and 16 digits), so a test compares them with a ``traceparent`` header or with the SDK's
``format_trace_id``/``format_span_id`` as they are.

The SDK's ``BatchSpanProcessor`` exports on a timer, so :meth:`OtlpReceiver.wait_for` waits on a condition that each
export notifies, never by polling; spans exported before the wait starts are returned at once.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal, TypeAlias

import grpc  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.trace import SpanKind, StatusCode

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
# Long enough for a BatchSpanProcessor's timer (5 s by default) and a loaded machine.
DEFAULT_TIMEOUT = 30.0

# An attribute's value as the SDK set it; OTLP's AnyValue also carries bytes, maps and absent values.
Value: TypeAlias = "str | int | float | bool | bytes | list[Value] | dict[str, Value] | None"


@dataclass(frozen=True)
class Event:
    name: str
    time_ns: int
    attributes: dict[str, Value]


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str
    attributes: dict[str, Value]


@dataclass(frozen=True)
class Span:
    """One received span. Ids are lower-case hex (W3C); ``parent_span_id`` is None for a root."""

    name: str
    kind: SpanKind
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    status: StatusCode
    status_message: str
    attributes: dict[str, Value]
    events: tuple[Event, ...]
    links: tuple[Link, ...]
    resource: dict[str, Value]
    scope: str

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Request:
    """One request the receiver answered: ``path`` (the gRPC method for gRPC), the headers (gRPC metadata for
    gRPC) with lower-case names, the status answered (HTTP's; 200 for a gRPC OK) and the spans it carried."""

    path: str
    headers: dict[str, str]
    status: int
    spans: tuple[Span, ...]


def _value(value: AnyValue) -> Value:
    match value.WhichOneof("value"):
        case "string_value":
            return value.string_value
        case "bool_value":
            return value.bool_value
        case "int_value":
            return value.int_value
        case "double_value":
            return value.double_value
        case "bytes_value":
            return value.bytes_value
        case "array_value":
            return [_value(item) for item in value.array_value.values]
        case "kvlist_value":
            return _attributes(value.kvlist_value.values)
        case _:
            return None


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Value]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _kind(kind: int) -> SpanKind:
    """OTLP numbers kinds from UNSPECIFIED = 0, the API from INTERNAL = 0; the spec reads UNSPECIFIED as INTERNAL."""
    return SpanKind(max(kind - 1, 0))


def decode(request: ExportTraceServiceRequest) -> tuple[Span, ...]:
    """The spans of one export, each with its resource's attributes and its instrumentation scope's name."""
    spans: list[Span] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            spans.extend(_span(span, resource, scope_spans.scope.name) for span in scope_spans.spans)
    return tuple(spans)


def _span(span: trace_pb2.Span, resource: dict[str, Value], scope: str) -> Span:
    return Span(
        name=span.name,
        kind=_kind(span.kind),
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex() or None,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status=StatusCode(span.status.code),
        status_message=span.status.message,
        attributes=_attributes(span.attributes),
        events=tuple(Event(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events),
        links=tuple(Link(k.trace_id.hex(), k.span_id.hex(), _attributes(k.attributes)) for k in span.links),
        resource=dict(resource),
        scope=scope,
    )


class OtlpReceiver:
    """The spans and requests one receiver got, in arrival order, and waits on them (thread-safe)."""

    def __init__(self, protocol: Protocol, endpoint: str) -> None:
        self.protocol = protocol
        self.endpoint = endpoint
        self._changed = threading.Condition()
        self._spans: list[Span] = []
        self._requests: list[Request] = []

    def record(self, request: Request) -> None:
        """Called by the server threads; wakes every waiter."""
        with self._changed:
            self._requests.append(request)
            self._spans.extend(request.spans)
            self._changed.notify_all()

    @property
    def spans(self) -> tuple[Span, ...]:
        with self._changed:
            return tuple(self._spans)

    @property
    def requests(self) -> tuple[Request, ...]:
        with self._changed:
            return tuple(self._requests)

    def wait_for(
        self, predicate: Callable[[tuple[Span, ...]], bool], timeout: float = DEFAULT_TIMEOUT
    ) -> tuple[Span, ...]:
        """Every span received once ``predicate`` holds for them; AssertionError, saying what came, after
        ``timeout`` seconds. The predicate is checked at once, then on each export."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(tuple(self._spans)), timeout):
                raise AssertionError(f"no match within {timeout} s; {self._describe()}")
            return tuple(self._spans)

    def wait_spans(
        self, count: int = 0, *, names: Iterable[str] = (), timeout: float = DEFAULT_TIMEOUT
    ) -> tuple[Span, ...]:
        """Every span received once there are at least ``count`` of them and one per entry of ``names``
        (a name given twice needs two spans of that name)."""
        wanted = Counter(names)

        def arrived(spans: tuple[Span, ...]) -> bool:
            seen = Counter(span.name for span in spans)
            return len(spans) >= count and all(seen[name] >= n for name, n in wanted.items())

        return self.wait_for(arrived, timeout)

    def by_name(self, name: str) -> tuple[Span, ...]:
        return tuple(span for span in self.spans if span.name == name)

    def one(self, name: str) -> Span:
        """The only span named ``name``; AssertionError when there is none or more than one."""
        found = self.by_name(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}; {self._describe()}"
        return found[0]

    def trace(self, trace_id: str) -> tuple[Span, ...]:
        """One trace's spans: what keeps apart the tests that share a receiver."""
        return tuple(span for span in self.spans if span.trace_id == trace_id)

    def children_of(self, parent: Span) -> tuple[Span, ...]:
        return tuple(
            span for span in self.spans if span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id
        )

    def parent_of(self, child: Span) -> Span | None:
        """The received parent of ``child``; None for a root or a parent not (yet) received."""
        for span in self.spans:
            if span.trace_id == child.trace_id and span.span_id == child.parent_span_id:
                return span
        return None

    def _describe(self) -> str:
        with self._changed:
            names = [span.name for span in self._spans]
            answered = [f"{request.path} -> {request.status}" for request in self._requests]
        return f"spans received: {names}; requests: {answered}"


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: ExportTraceServiceRequest, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        headers = {str(key).lower(): str(value) for key, value in context.invocation_metadata()}
        path = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        self._receiver.record(Request(path, headers, 200, decode(request)))
        return ExportTraceServiceResponse()


@contextlib.contextmanager
def _grpc_receiver() -> Iterator[OtlpReceiver]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port: int = server.add_insecure_port("127.0.0.1:0")
    receiver = OtlpReceiver("grpc", f"http://127.0.0.1:{port}")
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        _TraceService(receiver), server
    )
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=None).wait()


def _unpack(encoding: str, body: bytes) -> bytes | None:
    """The body without its Content-Encoding; None for an encoding OTLP exporters do not send."""
    match encoding.strip().lower():
        case "" | "identity":
            return body
        case "gzip":
            return gzip.decompress(body)
        case "deflate":
            return zlib.decompress(body)
        case _:
            return None


class _Handler(BaseHTTPRequestHandler):
    """OTLP/HTTP with binary protobuf: one route, ``POST /v1/traces``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's session expects
    server: _HttpServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, spans = self._export(body)
        headers = {key.lower(): value for key, value in self.headers.items()}
        self.server.receiver.record(Request(self.path, headers, status, spans))
        answer = ExportTraceServiceResponse().SerializeToString() if status == 200 else b""
        self.send_response(status)
        self.send_header("Content-Type", PROTOBUF)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def _export(self, body: bytes) -> tuple[int, tuple[Span, ...]]:
        if self.path != TRACES_PATH:
            return 404, ()
        if self.headers.get_content_type() != PROTOBUF:
            return 415, ()
        try:
            plain = _unpack(self.headers.get("Content-Encoding", ""), body)
            if plain is None:
                return 415, ()
            return 200, decode(ExportTraceServiceRequest.FromString(plain))
        except (OSError, EOFError, zlib.error, DecodeError):
            return 400, ()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test's output is not the place for an access log."""


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    receiver: OtlpReceiver


@contextlib.contextmanager
def _http_receiver() -> Iterator[OtlpReceiver]:
    server = _HttpServer(("127.0.0.1", 0), _Handler)
    server.receiver = OtlpReceiver("http/protobuf", f"http://127.0.0.1:{server.server_port}{TRACES_PATH}")
    # A short poll, so that leaving the block (shutdown waits for the loop to look) takes milliseconds.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="otlp-http-receiver", daemon=True)
    thread.start()
    try:
        yield server.receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def otlp_receiver(protocol: Protocol) -> Iterator[OtlpReceiver]:
    """A started receiver of ``protocol``; give the exporter ``receiver.endpoint``. Leaving the block stops it and
    frees its port."""
    with _grpc_receiver() if protocol == "grpc" else _http_receiver() as receiver:
        yield receiver
