"""The OTLP receiver the tracing tests read spans from (tests/otlp.py), driven by the real SDK and its exporters.

Each protocol's exporter sends a parent, a child with attributes, an event, a link and an error status, and a linked
span; the receiver's view must match, field by field, what the SDK itself finished (an ``InMemorySpanExporter`` on
the same provider is the reference).
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, format_span_id, format_trace_id

from tests.otlp import PROTOCOLS, OtlpReceiver, Protocol, Span, otlp_receiver

pytestmark = pytest.mark.e2e
SERVICE = "otlp-receiver-test"
# Sent as OTEL_EXPORTER_OTLP_HEADERS would send it: gRPC metadata, or HTTP headers.
KEY_HEADER = ("x-otlp-test-key", "k-123")


@pytest.fixture(params=PROTOCOLS)
def receiver(request: pytest.FixtureRequest) -> Iterator[OtlpReceiver]:
    protocol: Protocol = request.param
    with otlp_receiver(protocol) as started:
        yield started


def _exporter(receiver: OtlpReceiver) -> SpanExporter:
    headers = dict([KEY_HEADER])
    if receiver.protocol == "grpc":
        return GrpcExporter(endpoint=receiver.endpoint, headers=headers, timeout=5)
    return HttpExporter(endpoint=receiver.endpoint, headers=headers, timeout=5, compression=Compression.Gzip)


def _send_trace(receiver: OtlpReceiver) -> tuple[ReadableSpan, ...]:
    """A linked span, then a SERVER parent with a child that links to it; synchronous export, so every span has
    reached the receiver on return. Returns what the SDK finished, in the order it finished them."""
    reference = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(SimpleSpanProcessor(reference))
    provider.add_span_processor(SimpleSpanProcessor(_exporter(receiver)))
    tracer = provider.get_tracer("tests.otlp")
    with tracer.start_as_current_span("linked") as linked:
        pass
    with tracer.start_as_current_span("parent", kind=SpanKind.SERVER):
        link = Link(linked.get_span_context(), {"link.reason": "batched-with"})
        with tracer.start_as_current_span("child", links=[link]) as child:
            child.set_attribute("scorekit.items", 3)
            child.set_attribute("scorekit.model", "tiny")
            child.set_attribute("scorekit.ratio", 0.5)
            child.set_attribute("scorekit.cached", False)
            child.set_attribute("scorekit.sizes", [4, 2])
            child.add_event("queued", {"queue.depth": 2})
            child.set_status(Status(StatusCode.ERROR, "model failed"))
    provider.shutdown()
    return reference.get_finished_spans()


def _matches(got: Span, sent: ReadableSpan) -> None:
    context = sent.get_span_context()
    assert context is not None
    assert got.name == sent.name
    assert got.kind is sent.kind
    assert got.trace_id == format_trace_id(context.trace_id)
    assert got.span_id == format_span_id(context.span_id)
    assert got.parent_span_id == (format_span_id(sent.parent.span_id) if sent.parent else None)
    assert (got.start_ns, got.end_ns) == (sent.start_time, sent.end_time)
    assert (got.status, got.status_message) == (sent.status.status_code, sent.status.description or "")
    assert got.attributes == {key: list(v) if isinstance(v, tuple) else v for key, v in (sent.attributes or {}).items()}
    assert [(e.name, e.time_ns, e.attributes) for e in got.events] == [
        (e.name, e.timestamp, dict(e.attributes or {})) for e in sent.events
    ]
    assert [(k.trace_id, k.span_id, k.attributes) for k in got.links] == [
        (format_trace_id(k.context.trace_id), format_span_id(k.context.span_id), dict(k.attributes or {}))
        for k in sent.links
    ]
    assert got.resource == dict(sent.resource.attributes)
    assert got.scope == "tests.otlp"


def test_the_receiver_decodes_what_the_sdk_exported(receiver: OtlpReceiver) -> None:
    sent = _send_trace(receiver)
    got = receiver.wait_spans(names=["linked", "parent", "child"])
    assert [span.name for span in got] == [span.name for span in sent] == ["linked", "child", "parent"]
    for span, reference in zip(got, sent, strict=True):
        _matches(span, reference)
    parent, child, linked = receiver.one("parent"), receiver.one("child"), receiver.one("linked")
    assert parent.kind is SpanKind.SERVER and parent.parent_span_id is None
    assert receiver.children_of(parent) == (child,)
    assert receiver.parent_of(child) == parent
    assert receiver.parent_of(parent) is None
    assert receiver.trace(parent.trace_id) == (child, parent)
    assert child.attributes == {
        "scorekit.items": 3,
        "scorekit.model": "tiny",
        "scorekit.ratio": 0.5,
        "scorekit.cached": False,
        "scorekit.sizes": [4, 2],
    }
    assert [(event.name, event.attributes) for event in child.events] == [("queued", {"queue.depth": 2})]
    assert [(link.trace_id, link.span_id) for link in child.links] == [(linked.trace_id, linked.span_id)]
    assert child.links[0].attributes == {"link.reason": "batched-with"}
    assert (child.status, child.status_message) == (StatusCode.ERROR, "model failed")
    assert child.resource["service.name"] == SERVICE


def test_the_receiver_records_each_request_and_its_headers(receiver: OtlpReceiver) -> None:
    _send_trace(receiver)
    requests = receiver.requests
    assert [[span.name for span in request.spans] for request in requests] == [["linked"], ["child"], ["parent"]]
    for request in requests:
        assert request.status == 200
        assert request.headers[KEY_HEADER[0]] == KEY_HEADER[1]
        if receiver.protocol == "http/protobuf":
            assert request.path == "/v1/traces"
            assert request.headers["content-encoding"] == "gzip"


def test_spans_exported_before_the_wait_are_returned_at_once(receiver: OtlpReceiver) -> None:
    _send_trace(receiver)
    assert len(receiver.wait_spans(3, timeout=0)) == 3
    assert receiver.wait_for(lambda spans: any(span.name == "child" for span in spans), timeout=0)


def test_a_wait_wakes_on_an_export_that_comes_later(receiver: OtlpReceiver) -> None:
    later = threading.Timer(0.3, _send_trace, args=(receiver,))
    started = time.monotonic()
    later.start()
    try:
        spans = receiver.wait_spans(names=["parent"], timeout=20)
    finally:
        later.join()
    assert "parent" in [span.name for span in spans]
    assert time.monotonic() - started < 10


def test_a_wait_that_is_not_met_says_what_came(receiver: OtlpReceiver) -> None:
    _send_trace(receiver)
    came = r"no match within 0.05 s; spans received: \['linked', 'child', 'parent'\]"
    with pytest.raises(AssertionError, match=came):
        receiver.wait_spans(names=["parent", "parent"], timeout=0.05)
    with pytest.raises(AssertionError, match="0 spans named 'absent'"):
        receiver.one("absent")


def test_leaving_the_block_frees_the_port() -> None:
    for protocol in PROTOCOLS:
        with otlp_receiver(protocol) as receiver:
            port = int(receiver.endpoint.split(":")[2].split("/")[0])
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def _post(receiver: OtlpReceiver, path: str, body: bytes, headers: dict[str, str]) -> int:
    url = receiver.endpoint.removesuffix("/v1/traces") + path
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def test_http_takes_only_protobuf_posts_to_the_traces_path() -> None:
    body = ExportTraceServiceRequest().SerializeToString()
    protobuf = {"Content-Type": "application/x-protobuf"}
    with otlp_receiver("http/protobuf") as receiver:
        assert _post(receiver, "/v1/traces", body, protobuf) == 200
        assert _post(receiver, "/v1/traces", gzip.compress(body), {**protobuf, "Content-Encoding": "gzip"}) == 200
        assert _post(receiver, "/v1/metrics", body, protobuf) == 404
        assert _post(receiver, "/v1/traces", body, {"Content-Type": "application/json"}) == 415
        assert _post(receiver, "/v1/traces", body, {**protobuf, "Content-Encoding": "br"}) == 415
        assert _post(receiver, "/v1/traces", b"\xff\xff", protobuf) == 400
        assert [request.status for request in receiver.requests] == [200, 200, 404, 415, 415, 400]
        assert receiver.spans == ()
