"""vLLM's ``vllm:`` series beside scorekit's own, where a scoring server has the same quantity: a dashboard or an
autoscaler written for vLLM reads them unchanged. A served model's successful requests (``request_success_total``,
reason "stop") and their end-to-end time, the queue wait, and the requests waiting for their first batch and those
running, each labelled ``model_name``. Made deterministic by holding the model's forward on an event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from scorekit.app import ScorekitApp, create_app
from scorekit.host import wire
from scorekit.host.client import HostClient
from scorekit.load import LocalCell
from scorekit.model_job import ModelJob
from scorekit.models.base import Encoded, token_array
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.hardening.conftest import Sample, scrape
from tests.live import Live, serve, wait_for
from tests.tiny_models import build_cross_encoder

MODEL = "tiny-ce"
PAIR = {"query": "q", "documents": ["d"]}
# No small-job lane: a second small request waits for the batch running, as vLLM's waiting queue does.
ONE_AT_A_TIME = EngineConfig(max_batch_size=1, small_job_lane=0)


def by_model(name: str) -> Sample:
    return name, (("model_name", MODEL),)


SUCCESS: Sample = ("vllm:request_success_total", (("finished_reason", "stop"), ("model_name", MODEL)))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(str(build_cross_encoder(tmp_path)), name=MODEL, engine=ONE_AT_A_TIME))
    with serve(app) as live:
        yield app, live


def test_the_success_count_and_latencies_are_the_served_models_answers(served: tuple[ScorekitApp, Live]) -> None:
    _, live = served
    for path in ("/rerank", "/score", "/v1/rerank", "/invocations"):
        assert live.json("POST", path, PAIR if path != "/score" else {"queries": "q", "documents": ["d"]})[0] == 200
    assert live.json("POST", "/rerank", {"query": "q"})[0] == 400  # refused before it names a model
    assert live.json("POST", "/rerank", {**PAIR, "model": "other"})[0] == 404  # names none served
    too_long = live.json("POST", "/rerank", {"query": "q", "documents": ["word " * 400]})  # refused by the model
    assert (too_long[0], too_long[1]["error"]["param"]) == (400, "input_tokens")
    assert live.request("GET", "/health")[0] == live.request("HEAD", "/readyz")[0] == 200  # probes are no requests
    samples = scrape(live)
    assert samples[("scorekit_requests_rejected_total", (("model", MODEL), ("reason", "too_long")))] == 1
    assert samples[SUCCESS] == 4
    assert samples[by_model("vllm:e2e_request_latency_seconds_count")] == 4
    assert samples[by_model("vllm:e2e_request_latency_seconds_sum")] > 0
    queued = samples[("scorekit_queue_duration_seconds_count", (("model", MODEL),))]
    assert samples[by_model("vllm:request_queue_time_seconds_count")] == queued == 4
    assert (
        samples[by_model("vllm:request_queue_time_seconds_sum")]
        == samples[("scorekit_queue_duration_seconds_sum", (("model", MODEL),))]
    )
    assert (samples[by_model("vllm:num_requests_running")], samples[by_model("vllm:num_requests_waiting")]) == (0, 0)


class Held:
    """Holds every forward until released; ``entered`` is set by the first."""

    def __init__(self, app: ScorekitApp, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        engine = app.engine
        assert engine is not None
        backend: Any = engine.backend
        forward = backend.forward

        def held(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            self.entered.set()
            assert self.release.wait(60), "the test never released the model"
            return list(forward(batch))

        monkeypatch.setattr(backend, "forward", held)


def post_in_thread(live: Live, answers: list[int]) -> threading.Thread:
    thread = threading.Thread(target=lambda: answers.append(live.json("POST", "/rerank", PAIR, timeout=60)[0]))
    thread.start()
    return thread


def requests_now(live: Live) -> tuple[float, float]:
    """vLLM's running and waiting gauges for the model."""
    samples = scrape(live)
    return samples[by_model("vllm:num_requests_running")], samples[by_model("vllm:num_requests_waiting")]


def test_running_and_waiting_follow_a_request_from_the_queue_to_its_batch(
    served: tuple[ScorekitApp, Live], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, live = served
    held = Held(app, monkeypatch)
    answers: list[int] = []
    first = post_in_thread(live, answers)
    try:
        assert held.entered.wait(30)
        assert requests_now(live) == (1, 0)  # its batch runs
        second = post_in_thread(live, answers)
        assert wait_for(lambda: requests_now(live) == (1, 1)), requests_now(live)  # queued behind that batch
    finally:
        held.release.set()  # a failed check does not leave the model held
    first.join(60)
    second.join(60)
    assert answers == [200, 200]
    assert wait_for(lambda: requests_now(live) == (0, 0)), requests_now(live)


class _Quiet:
    def send(self, message: object) -> None:
        pass


class _Unobserved:
    def batch(self, size: int, tokens: int, seconds: float) -> None:
        pass

    def dropped(self, items: int) -> None:
        pass


def test_a_model_host_clients_books_move_a_job_from_waiting_to_running_to_gone() -> None:
    """With ``--model-host process`` (and ``--api-processes``, whose front ends count in board cells) the client
    counts its jobs as the host tells it: waiting until ``Started``, running until answered or aborted."""
    waiting, running = LocalCell(), LocalCell()
    client = HostClient(ModelSpec(host="process"), observer=_Unobserved(), request_cells=(waiting, running))
    client._running, client._channel = True, _Quiet()  # type: ignore[assignment]  # a host taking everything
    jobs = [ModelJob([Encoded(token_array([1, 2, 3]))], notify=lambda: None) for _ in range(3)]
    for job in jobs:
        client.submit(job)
    assert client.requests() == (waiting.value, running.value) == (3, 0)
    client._handle(wire.Started(0, 0.01))
    client._handle(wire.Started(0, 0.02))  # said twice: counted once
    assert client.requests() == (2, 1)
    client._handle(wire.Failed(0, "model_error", "injected"))
    assert client.requests() == (2, 0) and jobs[0].error is not None
    client._handle(wire.Started(1, 0.01))
    client.cancel(jobs[1])  # its client left while it ran
    client.cancel(jobs[2])  # and this one's while it waited
    assert client.requests() == (0, 0) and client.queue() == (0, 0)
