"""The queue-wait deadline (``max_queue_wait``) and the queue's token count, in the batcher and the engine.

The batcher runs on a fake clock, so "waited longer than the limit" is a number the test sets, not a sleep.
The engine test holds the worker on a gate: the waiting request cannot start before its deadline, whatever
the machine's speed, and the deadline is the only thing that can end its wait.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import anyio
import anyio.to_thread
import pytest
import torch

from scorekit.batching import Batcher
from scorekit.engine import Engine
from scorekit.errors import Overloaded, QueueTimeout
from scorekit.jobs import Job
from scorekit.model_host import LocalHost
from scorekit.models.base import Encoded, token_array
from scorekit.settings import EngineConfig

WAIT = 30.0  # seconds; only a hang reaches it


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job_of(lengths: list[int]) -> Job:
    return Job([Encoded(token_array([0] * n)) for n in lengths], notify=lambda: None)


def batcher_with(clock: Clock, limit: float | None = 5.0) -> Batcher:
    return Batcher(max_batch_tokens=10_000, max_batch_size=1, max_queued_items=100, max_queue_wait=limit, clock=clock)


def test_an_overdue_job_is_expired_before_the_next_batch_and_a_started_one_is_not() -> None:
    clock = Clock()
    batcher = batcher_with(clock)
    started, waiting = job_of([3, 4]), job_of([5, 6])
    batcher.submit(started)
    clock.now = 1.0
    batcher.submit(waiting)
    first = batcher.next_batch()
    assert first is not None and [item.job for item in first] == [started]
    assert started.started_at == 1.0 and waiting.started_at is None
    clock.now = 6.5  # `started` queued 6.5 s ago, `waiting` 5.5 s ago: both past 5 s, one of them has run
    fresh = job_of([2])  # queued just now: the batch after next is its
    batcher.submit(fresh)
    second = batcher.next_batch()
    assert second is not None and [item.job for item in second] == [started]
    assert waiting.done and isinstance(waiting.error, QueueTimeout) and isinstance(waiting.error, Overloaded)
    assert waiting.results == [None, None]  # none of its items ran
    assert "waited more than 5 s in the queue" in waiting.error.message
    assert (batcher.queued, batcher.queued_tokens) == (1, 2)  # only `fresh`
    assert not started.done  # its last item ran; the worker delivers it


def test_a_job_exactly_at_the_limit_or_without_one_stays() -> None:
    for limit, now in ((5.0, 5.0), (None, 1e9)):
        clock = Clock()
        batcher = batcher_with(clock, limit)
        job = job_of([3])
        batcher.submit(job)
        clock.now = now
        batch = batcher.next_batch()
        assert batch is not None and [item.job for item in batch] == [job] and job.error is None


def test_expire_takes_out_only_a_job_none_of_whose_work_ran() -> None:
    clock = Clock()
    batcher = batcher_with(clock)
    running, queued = job_of([2, 2]), job_of([7])
    batcher.submit(running)
    batcher.submit(queued)
    assert batcher.next_batch() is not None  # one item of `running`
    assert not batcher.expire(running)
    assert batcher.expire(queued)
    assert not batcher.expire(queued)  # once
    assert isinstance(queued.error, QueueTimeout)
    assert (batcher.queued, batcher.queued_tokens) == (1, 2)
    rest = batcher.next_batch()
    assert rest is not None and [item.job for item in rest] == [running]


def test_queued_tokens_follow_submit_cut_cancel_and_failure() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=2, max_queued_items=100)
    first, second = job_of([3, 5, 8]), job_of([4])
    batcher.submit(first)
    batcher.submit(second)
    assert (batcher.queued, batcher.queued_tokens) == (4, 20)
    batch = batcher.next_batch()  # one item of each job: first's shortest (3) and second's (4)
    assert batch is not None and sorted(item.encoded.cost for item in batch) == [3, 4]
    assert (batcher.queued, batcher.queued_tokens) == (2, 13)
    assert batcher.cancel(first) == 2
    assert (batcher.queued, batcher.queued_tokens) == (0, 0)
    batcher.submit(job_of([6, 6]))
    batcher.fail_all(RuntimeError("gone"))
    assert (batcher.queued, batcher.queued_tokens) == (0, 0)


class GatedBackend:
    """Returns each input's length; every batch waits for ``gate`` first."""

    kind = "bi-encoder"
    name = "gated"
    max_length = 64
    vocab_size = 100
    batch_cost_follows_tokens = True

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        self.entered.set()
        assert self.gate.wait(WAIT), "the test never opened the gate"
        return [torch.tensor(float(item.cost)) for item in batch]


class Recorder:
    """An EngineObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def batch(self, size: int, tokens: int, seconds: float) -> None:
        self.events.append(("batch", size))

    def dropped(self, items: int) -> None:
        self.events.append(("dropped", items))

    def tokenized(self, seconds: float) -> None:
        self.events.append(("tokenized", seconds))

    def waited(self, seconds: float) -> None:
        self.events.append(("waited", seconds))

    def rejected(self, reason: str) -> None:
        self.events.append(("rejected", reason))

    def cancelled(self, stage: str) -> None:
        self.events.append(("cancelled", stage))

    def failed(self, reason: str) -> None:
        self.events.append(("failed", reason))

    def model_seconds(self, key: str, seconds: float) -> None:
        self.events.append(("model_seconds", seconds))

    def kinds(self, kind: str) -> list[object]:
        return [value for name, value in self.events if name == kind]


def test_the_engine_answers_a_request_still_queued_at_its_deadline_and_none_of_it_runs() -> None:
    backend = GatedBackend()
    recorder = Recorder()
    engine = Engine(
        backend,  # type: ignore[arg-type]
        EngineConfig(max_batch_tokens=10_000, max_batch_size=1, max_queue_wait=0.05, small_job_lane=0),
        observer=recorder,
    )
    host = engine.host
    assert isinstance(host, LocalHost)
    # The batcher's own clock stands still, so only the engine's deadline can expire a job here.
    host.batcher._clock = lambda: 0.0
    engine.start()
    holder = job_of([3, 4])  # straight into the queue: no engine deadline of its own
    host.batcher.submit(holder)
    try:

        async def main() -> None:
            assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)
            with pytest.raises(QueueTimeout), anyio.fail_after(WAIT):
                await engine.run([Encoded(token_array([0] * 5)), Encoded(token_array([0] * 6))])

        anyio.run(main)
        assert (host.batcher.queued, host.batcher.queued_tokens) == (1, 4)  # only the holder's last item
    finally:
        backend.gate.set()
        engine.stop(WAIT)
    assert holder.done and holder.error is None
    assert host.worker.stats.items == 2  # the holder's two items, nothing of the expired request
    assert recorder.kinds("rejected") == ["queue_timeout"]
    assert recorder.kinds("waited") == [] and recorder.kinds("cancelled") == []
