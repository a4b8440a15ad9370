"""vLLM's ``priority`` field and the ``X-Request-Timeout`` deadline, over real sockets, in process and with the model
in a model host process (``--model-host process``, where both cross the wire).

In process the model is held on a first batch, so the requests behind it queue in a known order whatever the
machine's speed, and the batches run after the release are recorded by the length of their one input. In a host
process nothing can be held, so each batch holds one input and a large request keeps the model busy while the
others are sent: which answer comes back first says which ran first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from scorekit.app import ScorekitApp, create_app
from scorekit.engine import Engine
from scorekit.models.base import Encoded
from scorekit.settings import DEFAULT_MODEL_NAME, EngineConfig, Settings
from tests.e2e.texts import many_docs
from tests.hardening.conftest import scrape
from tests.live import Live, serve, wait_for

pytestmark = pytest.mark.e2e

# One input a batch and no small-job lane: one queue, taken one input at a time.
ONE_AT_A_TIME = EngineConfig(max_batch_size=1, max_batch_tokens=4096, small_job_lane=0, max_queue_wait=20.0)
# MiniLM's tokens for these: [CLS], the words, [SEP]; each request's one input is told apart by its length.
TEXTS = {3: "one", 4: "one two", 5: "one two three", 6: "one two three four"}
BLOCKER = "zero zero zero zero zero zero zero"  # 9 tokens


class Recorded:
    """Holds the model's first batch until released and records each batch's input lengths."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[int]] = []
        backend: Any = engine.backend
        forward = backend.forward

        def recorded(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            self.entered.set()
            assert self.release.wait(60), "the test never released the model"
            self.batches.append([len(item.input_ids) for item in batch])
            return list(forward(batch))

        monkeypatch.setattr(backend, "forward", recorded)


def post(
    live: Live, body: dict[str, Any], path: str = "/v1/embeddings", headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Send ``body`` in a thread; the dict fills with the status, headers, body and time of the answer."""
    answer: dict[str, Any] = {}

    def run() -> None:
        status, got, raw = live.request("POST", path, body, headers=headers, timeout=60)
        answer.update(status=status, headers=got, body=json.loads(raw), at=time.monotonic())

    answer["thread"] = thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return answer


def finished(*answers: dict[str, Any]) -> None:
    for answer in answers:
        answer["thread"].join(60)
        assert not answer["thread"].is_alive()


@pytest.fixture
def held_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Recorded, Live]]:
    app = create_app(Settings.for_model(engine=ONE_AT_A_TIME))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        yield engine, Recorded(engine, monkeypatch), live


def queue_behind_the_blocker(recorded: Recorded, live: Live) -> dict[str, Any]:
    blocker = post(live, {"input": BLOCKER})
    assert recorded.entered.wait(30), "the model never started the first batch"
    return blocker


def test_a_lower_priority_runs_earlier_whatever_the_arrival_order(held_server: tuple[Engine, Recorded, Live]) -> None:
    engine, recorded, live = held_server
    blocker = queue_behind_the_blocker(recorded, live)
    answers = []
    for queued, (length, priority) in enumerate(((3, 5), (4, 0), (5, -2), (6, 0)), 1):
        answers.append(post(live, {"input": TEXTS[length], "priority": priority}))
        assert wait_for(lambda n=queued: engine.snapshot().queued_items == n)  # type: ignore[misc]
    recorded.release.set()
    finished(blocker, *answers)
    assert all(answer["status"] == 200 for answer in answers)
    # After the blocker: priority -2, then the two of priority 0 in arrival order, then priority 5.
    assert recorded.batches == [[9], [5], [4], [6], [3]]


def test_cohere_s_embed_takes_its_priority_as_the_other_routes_do(held_server: tuple[Engine, Recorded, Live]) -> None:
    """Cohere's v2 embed has a ``priority`` field of the same meaning (lower first): it orders the queue too."""
    engine, recorded, live = held_server
    blocker = queue_behind_the_blocker(recorded, live)
    sent = (("/v2/embed", {"texts": [TEXTS[3]], "priority": 5}), ("/v1/embeddings", {"input": TEXTS[4]}))
    answers = []
    for queued, (path, body) in enumerate((*sent, ("/v2/embed", {"texts": [TEXTS[5]], "priority": -1})), 1):
        answers.append(post(live, body, path))
        assert wait_for(lambda n=queued: engine.snapshot().queued_items == n)  # type: ignore[misc]
    recorded.release.set()
    finished(blocker, *answers)
    assert [answer["status"] for answer in answers] == [200, 200, 200]
    assert recorded.batches == [[9], [5], [4], [3]]


def test_a_request_still_queued_at_its_deadline_gets_503_and_never_runs(
    held_server: tuple[Engine, Recorded, Live],
) -> None:
    engine, recorded, live = held_server
    before = scrape(live)
    blocker = queue_behind_the_blocker(recorded, live)
    patient = post(live, {"input": TEXTS[4]})
    assert wait_for(lambda: engine.snapshot().queued_items == 1)
    status, headers, raw = live.request(
        "POST", "/v1/embeddings", {"input": TEXTS[3]}, headers={"X-Request-Timeout": "0.4"}
    )
    assert status == 503 and headers["retry-after"] == "1"
    assert "waited more than 0.4 s in the queue before any of it ran" in json.loads(raw)["error"]["message"]
    assert engine.snapshot().queued_items == 1  # the patient one only
    recorded.release.set()
    finished(blocker, patient)
    assert patient["status"] == 200
    assert recorded.batches == [[9], [4]]  # nothing of the late request ran
    rejected = ("scorekit_requests_rejected_total", (("model", DEFAULT_MODEL_NAME), ("reason", "queue_timeout")))
    assert scrape(live)[rejected] - before.get(rejected, 0.0) == 1


def test_the_deadline_never_lengthens_max_queue_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(Settings.for_model(engine=EngineConfig(max_batch_size=1, small_job_lane=0, max_queue_wait=0.3)))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        recorded = Recorded(engine, monkeypatch)
        blocker = queue_behind_the_blocker(recorded, live)
        status, _, raw = live.request("POST", "/v1/embeddings", {"input": "x"}, headers={"X-Request-Timeout": "3"})
        recorded.release.set()
        finished(blocker)
    assert status == 503 and "waited more than 0.3 s" in json.loads(raw)["error"]["message"]


def test_a_deadline_that_passed_while_the_request_tokenized_is_answered_at_once(
    minilm_app: ScorekitApp, minilm: Live
) -> None:
    engine = minilm_app.engine
    assert engine is not None
    before = engine.snapshot().worker.items
    status, _, raw = minilm.request(
        "POST", "/v1/embeddings", {"input": many_docs(50)}, headers={"X-Request-Timeout": "0.000001"}
    )
    assert status == 503 and "waited more than 1e-06 s" in json.loads(raw)["error"]["message"]
    assert engine.snapshot().worker.items == before


@pytest.mark.parametrize("given", ["0", "-1", "abc", "nan", "inf", ""])
def test_a_timeout_that_is_no_number_of_seconds_more_than_0_is_a_400_naming_the_header(
    minilm_app: ScorekitApp, minilm: Live, given: str
) -> None:
    engine = minilm_app.engine
    assert engine is not None
    before = engine.snapshot().worker.items
    status, body = minilm.json(
        "POST", "/rerank", {"query": "q", "documents": ["d"]}, headers={"X-Request-Timeout": given}
    )
    assert status == 400 and body["error"]["param"] == "X-Request-Timeout", body
    assert engine.snapshot().worker.items == before


@pytest.mark.parametrize("given", ["high", 1.5, True, None])
def test_a_priority_that_is_no_whole_number_is_a_400_naming_the_field(minilm: Live, given: object) -> None:
    for path, body in (("/v1/embeddings", {"input": "x"}), ("/score", {"queries": "q", "documents": ["d"]})):
        status, answer = minilm.json("POST", path, {**body, "priority": given})
        assert status == 400 and answer["error"]["param"] == "body.priority", answer


# -- with the model in a host process -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hosted() -> Iterator[tuple[ScorekitApp, Live]]:
    engine = EngineConfig(max_batch_size=1, max_batch_tokens=4096, small_job_lane=0, priority_aging=60.0)
    app = create_app(Settings.for_model(engine=engine, host="process"))
    with serve(app) as live:
        yield app, live


def test_priority_and_deadline_cross_to_a_model_host_process(hosted: tuple[ScorekitApp, Live]) -> None:
    """While a 400-input rerank runs one input a batch, a priority -5 request overtakes it and a priority 5 one
    waits for its end; a request with a 50 ms deadline is expired by the host's batcher, never run. The priority 5
    request's one input is long (a forward several times a short one's), so its answer cannot overtake the
    rerank's on the way back."""
    app, live = hosted
    engine = app.engine
    assert engine is not None
    before = scrape(live)
    big = post(live, {"query": "q", "documents": many_docs(399)}, "/rerank")
    assert wait_for(lambda: engine.snapshot().worker.batches > 0, timeout=30)
    low = post(live, {"input": " ".join(["word"] * 250), "priority": 5})
    high = post(live, {"input": TEXTS[4], "priority": -5})
    status, _, raw = live.request("POST", "/v1/embeddings", {"input": TEXTS[5]}, headers={"X-Request-Timeout": "0.05"})
    finished(big, low, high)
    assert (big["status"], low["status"], high["status"]) == (200, 200, 200)
    assert high["at"] < big["at"] < low["at"]
    assert status == 503 and "waited more than 0.05 s" in json.loads(raw)["error"]["message"]
    assert engine.snapshot().worker.items == 402  # the deadline's request never ran
    rejected = ("scorekit_requests_rejected_total", (("model", DEFAULT_MODEL_NAME), ("reason", "queue_timeout")))
    assert scrape(live)[rejected] - before.get(rejected, 0.0) == 1
