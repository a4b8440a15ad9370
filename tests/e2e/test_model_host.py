"""``--model-host process`` end to end, over real sockets: the model's batcher, worker and weights in a model host
process of their own, the server tokenizing and sending it token ids.

The answers are the in-process ones (to 1e-5: batches of other sizes move the last bits); a request the server
refuses (400) never reaches the host; a client that leaves while its job is queued has none of its items run;
a host killed outright turns /health and every request to 503 at once (and stays so: `scorekit serve` exits, an
embedding app keeps serving); the server's shutdown stops the host.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.host.client import HostClient
from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.e2e.test_several_models import post_in_thread
from tests.e2e.texts import DOCS, QUERY, many_docs
from tests.hardening.conftest import scrape
from tests.live import Live, close_answers, serve, settled_items, wait_for

# Small batches and no small-job lane: a large request spans many batches, and a small one queued behind it
# waits in the one queue (the lane's thread would take it at once).
QUEUED = EngineConfig(max_batch_size=16, max_batch_tokens=4096, small_job_lane=0)


def _engine(app: ScorekitApp) -> Engine:
    engine = app.engine
    assert engine is not None
    return engine


def _host_pid(app: ScorekitApp) -> int:
    """The model host process of the app's (first) model."""
    host = _engine(app).host
    assert isinstance(host, HostClient) and host.pid is not None
    return host.pid


def _gone(pid: int) -> bool:
    """The process has exited and been reaped (its parent waited for it)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def hosted_cross_encoder(cross_encoder_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(str(cross_encoder_dir), name="tiny-ce", host="process"))
    with serve(app) as live:
        yield app, live


@pytest.fixture(scope="module")
def hosted_minilm() -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(engine=QUEUED, host="process"))
    with serve(app) as live:
        yield app, live


def _same_answers(hosted: Live, in_process: Live, path: str, body: dict[str, Any]) -> None:
    status, got = hosted.json("POST", path, body)
    expected_status, expected = in_process.json("POST", path, body)
    assert status == expected_status == 200, got
    for key in ("id", "created"):  # the request's own
        got.pop(key, None)
        expected.pop(key, None)
    assert close_answers(got, expected), (got, expected)


def test_a_cross_encoder_in_a_host_process_answers_what_it_answers_in_process(
    hosted_cross_encoder: tuple[ScorekitApp, Live], cross_encoder: Live
) -> None:
    _, live = hosted_cross_encoder
    _same_answers(live, cross_encoder, "/rerank", {"query": QUERY, "documents": DOCS})
    _same_answers(live, cross_encoder, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    _same_answers(live, cross_encoder, "/score", {"queries": QUERY, "documents": DOCS})
    _same_answers(live, cross_encoder, "/score", {"queries": DOCS, "documents": DOCS[::-1], "use_activation": False})
    _same_answers(live, cross_encoder, "/score", {"queries": QUERY, "documents": many_docs(40)})  # several batches


def test_a_bi_encoder_in_a_host_process_answers_what_it_answers_in_process(
    hosted_minilm: tuple[ScorekitApp, Live], minilm: Live
) -> None:
    _, live = hosted_minilm
    _same_answers(live, minilm, "/score", {"queries": QUERY, "documents": DOCS})
    _same_answers(live, minilm, "/rerank", {"query": QUERY, "documents": many_docs(40)})
    _same_answers(live, minilm, "/v1/embeddings", {"input": [QUERY, *DOCS]})


def test_the_v1_models_card_is_the_hosts(hosted_cross_encoder: tuple[ScorekitApp, Live], cross_encoder: Live) -> None:
    _, live = hosted_cross_encoder
    (card,) = live.json("GET", "/v1/models")[1]["data"]
    (expected,) = cross_encoder.json("GET", "/v1/models")[1]["data"]
    assert [card[key] for key in ("id", "root", "max_model_len")] == [
        expected[key] for key in ("id", "root", "max_model_len")
    ]


def test_a_request_the_server_refuses_never_reaches_the_host(
    hosted_cross_encoder: tuple[ScorekitApp, Live],
) -> None:
    app, live = hosted_cross_encoder
    engine = _engine(app)
    before = settled_items(app), engine.snapshot().worker.batches
    refused: list[bytes | dict[str, Any]] = [
        b'{"query": "no end',  # not JSON
        {"query": 1, "documents": ["a"]},  # a wrong type
        {"query": QUERY, "documents": []},  # nothing to score
        {"query": QUERY, "documents": ["word " * 400]},  # longer than the model takes (128 tokens)
        {"query": QUERY, "documents": DOCS, "top_n": -1},
    ]
    for body in refused:
        status, _, raw = live.request("POST", "/rerank", body)
        assert status == 400, raw
    assert (settled_items(app), engine.snapshot().worker.batches) == before
    assert live.json("POST", "/rerank", {"query": QUERY, "documents": DOCS})[0] == 200
    assert settled_items(app) == before[0] + len(DOCS)  # the counts do move for work that reaches the host


def test_a_client_that_leaves_while_queued_in_the_host_has_none_of_its_items_run(
    hosted_minilm: tuple[ScorekitApp, Live],
) -> None:
    """The host is paused (SIGSTOP) while a large request runs, so a small request queued behind it cannot
    start: its client leaves, and once the host runs again (its worker in the middle of the large request's
    batches, its reader taking the small one's submission and abort at once) the large one ends and nothing of
    the small one has run."""
    app, live = hosted_minilm
    engine, pid = _engine(app), _host_pid(app)
    start = settled_items(app)
    large = many_docs(300)
    cancelled = ("scorekit_requests_cancelled_total", (("model", DEFAULT_MODEL_NAME), ("stage", "queued")))
    cancelled_before = scrape(live).get(cancelled, 0.0)
    running, answer = post_in_thread(live, "/rerank", {"query": QUERY, "documents": large})
    assert wait_for(lambda: engine.snapshot().worker.items > start, timeout=60), "the large request never ran"
    os.kill(pid, signal.SIGSTOP)
    try:
        sock = live.send_json("/rerank", {"query": "a late query", "documents": ["never run", "nor this"]})
        # A paused host answers no snapshot: the client's own books say what it has sent and not had answered.
        assert wait_for(lambda: engine.snapshot().queued_items == len(large) + 1 + 3, timeout=20)
        sock.close()
        # The server answers the leaving client itself: the job is cancelled while queued, the host told.
        assert wait_for(lambda: scrape(live).get(cancelled, 0.0) == cancelled_before + 1, timeout=10)
        assert live.wait_load(1, timeout=10) == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    running.join(120)
    assert answer["status"] == 200 and len(answer["body"]["results"]) == len(large)
    assert live.wait_load(0, timeout=10) == 0
    assert settled_items(app) == start + 1 + len(large)  # the large request's query and documents, nothing more


def test_metrics_never_wait_on_the_host(
    hosted_cross_encoder: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/metrics runs on the event loop: its queue gauges come from the server's own books, never from a round
    trip to the host (which a busy or stopped host would make the whole server wait on)."""
    _, live = hosted_cross_encoder

    def asked(self: HostClient) -> None:
        raise AssertionError("the metrics asked the model host for a snapshot")

    monkeypatch.setattr(HostClient, "snapshot", asked)
    status, _, text = live.request("GET", "/metrics")
    assert status == 200
    assert 'scorekit_queue_depth{model="tiny-ce"} 0.0' in text.decode()


def test_a_host_that_dies_turns_health_and_requests_to_503_at_once(cross_encoder_dir: Path) -> None:
    app = create_app(Settings.for_model(str(cross_encoder_dir), name="tiny-ce", host="process"))
    with serve(app) as live:
        assert live.json("POST", "/rerank", {"query": QUERY, "documents": DOCS})[0] == 200
        assert live.json("GET", "/health")[0] == 200
        os.kill(_host_pid(app), signal.SIGKILL)
        assert wait_for(lambda: live.json("GET", "/health")[0] == 503, timeout=10), "/health still answers 200"
        status, payload = live.json("POST", "/rerank", {"query": QUERY, "documents": DOCS}, timeout=10)
        assert status == 503, payload
        assert live.wait_load(0, timeout=10) == 0
        # An embedding app owns its process: it keeps serving, and its own health check sees the 503.
        assert live.json("GET", "/health")[0] == 503


def test_the_servers_shutdown_stops_its_host_process(cross_encoder_dir: Path) -> None:
    app = create_app(Settings.for_model(str(cross_encoder_dir), name="tiny-ce", host="process"))
    with serve(app) as live:
        assert live.json("POST", "/score", {"queries": QUERY, "documents": DOCS})[0] == 200
        pid = _host_pid(app)
        assert not _gone(pid)
    assert wait_for(lambda: _gone(pid), timeout=30), "the model host process outlived the server"
