"""OpenTelemetry traces over real sockets, received by a real OTLP receiver started in the test (``tests/otlp.py``),
over gRPC and over HTTP/protobuf: one span per request continuing the client's ``traceparent``; its children decode,
tokenize, queue, batch and encode; a batch's span linking every request that rode in it (in process, and from a model
host process, whose batches cross the wire); the client's leaving and the dropped work as events.

The model is held on a first batch where the test needs requests to queue together (as
``test_priority_and_deadlines.py`` holds it), so which requests share a batch does not hang on the machine's speed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from opentelemetry.trace import SpanKind, StatusCode

from scorekit.app import create_app
from scorekit.engine import Engine
from scorekit.models.base import Encoded
from scorekit.settings import EngineConfig, Settings
from tests.live import Live, serve, wait_for
from tests.otlp import PROTOCOLS, OtlpReceiver, Protocol, Span, otlp_receiver

pytestmark = pytest.mark.e2e

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
CHILDREN = ("decode", "tokenize", "queue", "batch", "encode")
# Room for every queued request in one batch, and no small-job lane, so those queued behind the held batch share one.
TOGETHER = EngineConfig(max_batch_tokens=4096, small_job_lane=0, max_queue_wait=30.0)


@pytest.fixture(autouse=True)
def prompt_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's batch processor exports every 5 s by default: every 50 ms here, so a test waits for its spans
    briefly (the receiver's waits are event-driven and generous)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)


@pytest.fixture(params=PROTOCOLS)
def receiver(request: pytest.FixtureRequest) -> Iterator[OtlpReceiver]:
    with otlp_receiver(request.param) as started:
        yield started


def traced(receiver: OtlpReceiver, **given: Any) -> Settings:
    protocol: Protocol = receiver.protocol
    return Settings.for_model(otlp_traces_endpoint=receiver.endpoint, otlp_traces_protocol=protocol, **given)


def request_span(receiver: OtlpReceiver, request_id: str, children: Sequence[str] = CHILDREN) -> Span:
    """The span of the request with that X-Request-Id, once it and the named children have arrived."""

    def arrived(spans: tuple[Span, ...]) -> bool:
        found = [span for span in spans if span.attributes.get("scorekit.request_id") == request_id]
        if not found:
            return False
        names = [span.name for span in spans if span.parent_span_id == found[0].span_id]
        return all(name in names for name in children)

    spans = receiver.wait_for(arrived)
    return next(span for span in spans if span.attributes.get("scorekit.request_id") == request_id)


def test_a_request_s_span_continues_its_traceparent_with_a_child_for_each_stage(receiver: OtlpReceiver) -> None:
    app = create_app(traced(receiver, otlp_service_name="reranking"))
    with serve(app) as live:
        body = {"query": "what is a cat", "documents": ["a cat is an animal", "paris is a city"]}
        headers = {"traceparent": TRACEPARENT, "x-request-id": "traced-1"}
        status, _, raw = live.request("POST", "/v1/rerank", body, headers=headers)
        assert status == 200, raw
        span = request_span(receiver, "traced-1")
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, CLIENT_SPAN)
    assert span.kind == SpanKind.SERVER
    assert span.name == "POST /rerank"  # the canonical route: the alias the client used is its url.path
    assert span.attributes["http.route"] == "/rerank"
    assert span.attributes["url.path"] == "/v1/rerank"
    assert span.attributes["http.request.method"] == "POST"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["scorekit.model"] == app.settings.models[0].served_name
    assert (
        isinstance(span.attributes["scorekit.model_seconds"], float) and span.attributes["scorekit.model_seconds"] > 0
    )
    assert span.status == StatusCode.UNSET
    assert span.resource["service.name"] == "reranking"
    children = {child.name: child for child in receiver.children_of(span)}
    assert sorted(children) == sorted(CHILDREN)
    for child in children.values():
        assert span.start_ns <= child.start_ns <= child.end_ns <= span.end_ns, child.name
    # In order: the body decoded, tokenized, queued until its batch, then the answer encoded.
    order = [children[name] for name in ("decode", "tokenize", "queue", "batch", "encode")]
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(order))
    batch = children["batch"]
    assert children["queue"].end_ns == batch.start_ns
    # One query and two documents: three distinct texts, all in the one batch, all this request's.
    assert batch.attributes["scorekit.batch.items"] == 3
    assert batch.attributes["scorekit.batch.own_items"] == 3
    assert batch.attributes["scorekit.batch.requests"] == 1
    assert batch.attributes["scorekit.batch.padded_tokens"] > 0
    assert [(link.trace_id, link.span_id) for link in batch.links] == [(TRACE_ID, span.span_id)]
    assert children["tokenize"].attributes["scorekit.inputs"] == 3
    assert children["queue"].attributes["scorekit.items"] == 3


def test_a_request_without_a_traceparent_starts_a_trace_of_its_own(receiver: OtlpReceiver) -> None:
    with serve(create_app(traced(receiver))) as live:
        status, _, _ = live.request("POST", "/v1/embeddings", {"input": "hello"}, headers={"x-request-id": "root"})
        assert status == 200
        span = request_span(receiver, "root")
    assert span.parent_span_id is None and span.trace_id != TRACE_ID
    assert span.resource["service.name"] == "scorekit"


def test_the_probes_are_not_traced(receiver: OtlpReceiver) -> None:
    """A load balancer's probes come every few seconds: their spans would drown the requests'."""
    with serve(create_app(traced(receiver))) as live:
        for path in ("/health", "/healthz", "/readyz", "/load", "/metrics", "/ping"):
            assert live.request("GET", path, headers={"traceparent": TRACEPARENT})[0] == 200, path
        assert live.request("GET", "/v1/models", headers={"x-request-id": "models"})[0] == 200
        models = request_span(receiver, "models", children=())  # exported after the probes: theirs would be in too
    assert not receiver.trace(TRACE_ID)
    assert {span.trace_id for span in receiver.spans} == {models.trace_id}  # its own span and its encode
    assert models.name == "GET /v1/models"


def test_a_client_that_asks_for_no_sampling_gets_no_spans(receiver: OtlpReceiver) -> None:
    """The default sampler follows the parent: a ``traceparent`` whose sampled flag is off is exported nowhere, and
    none of the work below records anything."""
    with serve(create_app(traced(receiver))) as live:
        unsampled = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-00", "x-request-id": "unsampled"}
        assert live.request("POST", "/v1/embeddings", {"input": "hello"}, headers=unsampled)[0] == 200
        assert live.request("POST", "/v1/embeddings", {"input": "hi"}, headers={"x-request-id": "marker"})[0] == 200
        request_span(receiver, "marker")  # exported after the unsampled request ended: its spans would be in too
    assert not receiver.trace(TRACE_ID)


class Held:
    """Holds the model's first batch until released (the batches behind it queue), and counts the batches."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[int] = []
        backend: Any = engine.backend
        forward = backend.forward

        def held(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            self.entered.set()
            assert self.release.wait(60), "the test never released the model"
            self.batches.append(len(batch))
            return list(forward(batch))

        monkeypatch.setattr(backend, "forward", held)


def post(live: Live, body: dict[str, Any], request_id: str, **headers: str) -> threading.Thread:
    def run() -> None:
        status, _, raw = live.request("POST", "/v1/embeddings", body, headers={"x-request-id": request_id, **headers})
        assert status == 200, raw

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def held_server(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Held, Live]]:
    """A traced server whose model holds its first batch (request "first", running) until the block releases it: the
    requests sent meanwhile queue together. Leaving the block releases the model and waits for "first"."""
    app = create_app(traced(receiver, engine=TOGETHER))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        held = Held(engine, monkeypatch)
        first = post(live, {"input": "zero zero zero"}, "first")
        assert held.entered.wait(30)
        try:
            yield engine, held, live
        finally:
            held.release.set()
            first.join(60)


def leave_while_queued(engine: Engine, live: Live) -> None:
    """A client sends three inputs behind the held batch and leaves while they are queued; the batcher drops them."""
    sock = live.send_json("/v1/embeddings", {"input": ["one", "two", "three"]})
    assert wait_for(lambda: engine.snapshot().queued_items == 3)
    sock.close()
    assert wait_for(lambda: engine.snapshot().queued_items == 0)


def test_a_batch_s_span_links_every_request_that_rode_in_it(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with held_server(receiver, monkeypatch) as (engine, held, live):
        second = post(live, {"input": ["one", "one two"]}, "second")
        assert wait_for(lambda: engine.snapshot().queued_items == 2)
        third = post(live, {"input": "three"}, "third")
        assert wait_for(lambda: engine.snapshot().queued_items == 3)
        held.release.set()
        for thread in (second, third):
            thread.join(60)
    spans = {name: request_span(receiver, name) for name in ("first", "second", "third")}
    assert held.batches == [1, 3]  # the first alone, then the two queued requests' three inputs together
    batches = {name: [s for s in receiver.children_of(span) if s.name == "batch"] for name, span in spans.items()}
    assert all(len(found) == 1 for found in batches.values())
    shared = {(spans["second"].trace_id, spans["second"].span_id), (spans["third"].trace_id, spans["third"].span_id)}
    for name, own in (("second", 2), ("third", 1)):
        (batch,) = batches[name]
        assert {(link.trace_id, link.span_id) for link in batch.links} == shared
        assert batch.attributes["scorekit.batch.items"] == 3
        assert batch.attributes["scorekit.batch.requests"] == 2
        assert batch.attributes["scorekit.batch.own_items"] == own
    (alone,) = batches["first"]
    assert [(link.trace_id, link.span_id) for link in alone.links] == [
        (spans["first"].trace_id, spans["first"].span_id)
    ]
    # The queued requests waited for the held batch: their queue spans end when their shared batch began.
    (second_batch,) = batches["second"]
    assert second_batch.start_ns >= alone.end_ns
    (queue,) = [s for s in receiver.children_of(spans["second"]) if s.name == "queue"]
    assert queue.end_ns == second_batch.start_ns and queue.duration_ns > 0


def test_a_client_that_leaves_while_queued_is_an_event_and_its_dropped_work_another(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with held_server(receiver, monkeypatch) as (engine, held, live):
        leave_while_queued(engine, live)

    def left(spans: tuple[Span, ...]) -> bool:
        return any(span.attributes.get("http.response.status_code") == 499 for span in spans)

    gone = next(s for s in receiver.wait_for(left) if s.attributes.get("http.response.status_code") == 499)
    events = {event.name: event for event in gone.events}
    assert set(events) == {"scorekit.disconnect", "scorekit.work_dropped"}
    assert events["scorekit.work_dropped"].attributes == {"scorekit.reason": "client_left", "scorekit.items": 3}
    assert events["scorekit.disconnect"].time_ns <= events["scorekit.work_dropped"].time_ns
    assert gone.status == StatusCode.UNSET  # the client's doing, not the server's error
    names = [child.name for child in receiver.children_of(gone)]
    assert "batch" not in names and "encode" not in names  # none of its work ran; nothing was answered
    assert "queue" in names
    assert held.batches == [1]


def test_a_disconnect_observer_that_fails_does_not_stop_the_cancellation(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lifecycle tells the traces of the client's leaving from its own pump, just before it cancels the app: an
    observer that raises there is logged, and the request is still cancelled, its queued work dropped, its load
    given back."""
    from opentelemetry.sdk.trace import Span as SdkSpan

    added = SdkSpan.add_event

    def failing(self: SdkSpan, name: str, *args: Any, **kwargs: Any) -> None:
        if name == "scorekit.disconnect":
            raise RuntimeError("an observer failed")
        added(self, name, *args, **kwargs)

    monkeypatch.setattr(SdkSpan, "add_event", failing)
    with held_server(receiver, monkeypatch) as (engine, held, live):
        leave_while_queued(engine, live)  # cancelled all the same
        held.release.set()
        assert live.wait_load(0, timeout=30) == 0
    assert held.batches == [1]


def test_a_request_whose_deadline_passes_in_the_queue_is_a_server_error_span_with_its_dropped_work(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with held_server(receiver, monkeypatch) as (_, _, live):
        status, _, raw = live.request(
            "POST",
            "/v1/embeddings",
            {"input": ["one", "two"]},
            headers={"x-request-id": "late", "X-Request-Timeout": "0.2"},
        )
    assert status == 503, raw
    span = request_span(receiver, "late", children=("decode", "tokenize", "queue"))
    assert span.attributes["http.response.status_code"] == 503
    assert span.status == StatusCode.ERROR
    (dropped,) = [event for event in span.events if event.name == "scorekit.work_dropped"]
    assert dropped.attributes == {"scorekit.reason": "deadline", "scorekit.items": 2}
    assert "batch" not in [child.name for child in receiver.children_of(span)]


def test_a_batch_the_model_fails_on_is_an_error_span_under_a_500(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 500 marks the request's span as an error (the first status that does), and its batch's span says the model
    failed there; a 4xx leaves the request's span unset (the client's doing)."""
    app = create_app(traced(receiver))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        backend: Any = engine.backend

        def broken(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            raise RuntimeError("the model broke")

        monkeypatch.setattr(backend, "forward", broken)
        status, _, raw = live.request("POST", "/v1/embeddings", {"input": "hello"}, headers={"x-request-id": "broke"})
        assert status == 500, raw
        bad = live.request("POST", "/v1/embeddings", {"inputs": 1}, headers={"x-request-id": "bad"})
        assert bad[0] == 400
        span = request_span(receiver, "broke", children=("decode", "tokenize", "queue", "batch"))
        refused = request_span(receiver, "bad", children=("decode",))
    assert span.attributes["http.response.status_code"] == 500
    assert span.status == StatusCode.ERROR
    (batch,) = [child for child in receiver.children_of(span) if child.name == "batch"]
    assert batch.status == StatusCode.ERROR
    assert refused.attributes["http.response.status_code"] == 400
    assert refused.status == StatusCode.UNSET


def test_a_stage_s_span_is_an_error_for_the_server_s_fault_not_the_client_s(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that cannot be decoded and an input too long are the client's (400s): their decode and tokenize spans
    stay unset, as the request's does. A tokenizing that fails on the server's side (a 500) is an error span."""
    app = create_app(traced(receiver))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        bad = live.request("POST", "/v1/embeddings", {"inputs": 1}, headers={"x-request-id": "bad-body"})
        long = {"query": "q", "documents": ["word " * 400]}
        too_long = live.request("POST", "/rerank", long, headers={"x-request-id": "too-long"})
        assert (bad[0], too_long[0]) == (400, 400), (bad, too_long)

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the tokenizer broke")

        monkeypatch.setattr(engine, "prepare", broken)
        failed = live.request("POST", "/rerank", {"query": "q", "documents": ["d"]}, headers={"x-request-id": "broke"})
        assert failed[0] == 500, failed
        spans = {
            request_id: request_span(receiver, request_id, children=(child,))
            for request_id, child in (("bad-body", "decode"), ("too-long", "tokenize"), ("broke", "tokenize"))
        }

    def stage(request_id: str, name: str) -> Span:
        (child,) = [child for child in receiver.children_of(spans[request_id]) if child.name == name]
        return child

    assert stage("bad-body", "decode").status == spans["bad-body"].status == StatusCode.UNSET
    assert stage("too-long", "tokenize").status == spans["too-long"].status == StatusCode.UNSET
    assert stage("broke", "tokenize").status == spans["broke"].status == StatusCode.ERROR


def test_the_batches_of_a_model_host_process_come_back_as_spans_with_their_links(receiver: OtlpReceiver) -> None:
    """With ``--model-host process`` the batches run in another process: each traced job's span crosses the wire
    down, and the batches it rode in come back with its answer."""
    app = create_app(traced(receiver, host="process"))
    with serve(app) as live:
        headers = {"traceparent": TRACEPARENT, "x-request-id": "hosted"}
        body = {"input": ["one", "one two", "one two three"]}
        status, _, raw = live.request("POST", "/v1/embeddings", body, headers=headers)
        assert status == 200, raw
        span = request_span(receiver, "hosted")
    batches = [child for child in receiver.children_of(span) if child.name == "batch"]
    assert batches and sum(int(batch.attributes["scorekit.batch.own_items"]) for batch in batches) == 3
    for batch in batches:
        assert (TRACE_ID, span.span_id) in {(link.trace_id, link.span_id) for link in batch.links}
        assert span.start_ns <= batch.start_ns <= batch.end_ns <= span.end_ns
    (queue,) = [child for child in receiver.children_of(span) if child.name == "queue"]
    assert queue.end_ns == min(batch.start_ns for batch in batches)
    assert json.loads(raw)["data"][0]["embedding"]
    assert time.time_ns() >= span.end_ns
