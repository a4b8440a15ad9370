"""The batcher's scheduling on its own, on a clock the test moves: priorities with aging, weighted fair queuing
over the items by key, a job's own deadline; the worker's split of each batch's time by tokens; and the schedule
crossing the wire to a model host process.

Each rule is checked against the order it must give, written out, so a test fails when the rule breaks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec
import pytest
import torch

from scorekit.batching import Batcher
from scorekit.errors import QueueTimeout
from scorekit.host import wire
from scorekit.jobs import Job, Schedule
from scorekit.models.base import Encoded, token_array
from scorekit.worker import ModelWorker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job_of(
    lengths: Sequence[int], *, priority: int = 0, key: str = "", weight: float = 1.0, timeout: float | None = None
) -> Job[Encoded, torch.Tensor]:
    inputs = [Encoded(token_array(range(n))) for n in lengths]
    return Job(inputs, notify=lambda: None, schedule=Schedule(priority, key, weight, timeout))


def batcher(
    clock: Clock, *, size: int, aging: float = 1.0, wait: float | None = None
) -> Batcher[Encoded, torch.Tensor]:
    return Batcher(
        max_batch_tokens=100_000,
        max_batch_size=size,
        max_queued_items=100_000,
        max_queue_wait=wait,
        batch_efficiency=None,
        priority_aging=aging,
        clock=clock,
    )


def cut(queue: Batcher[Encoded, torch.Tensor]) -> list[Job[Encoded, torch.Tensor]]:
    batch = queue.next_batch()
    assert batch is not None
    return [item.job for item in batch]


# -- priorities ----------------------------------------------------------------------------------------------


def test_lower_priority_runs_earlier_whatever_the_arrival_order() -> None:
    queue = batcher(Clock(), size=1)
    late, middle, early = job_of([4], priority=5), job_of([4]), job_of([4], priority=-3)
    for job in (late, middle, early):
        queue.submit(job)
    assert [cut(queue) for _ in range(3)] == [[early], [middle], [late]]


def test_the_first_pass_serves_the_more_urgent_level_before_one_item_of_each() -> None:
    queue = batcher(Clock(), size=2)
    low, first, second = job_of([4, 4], priority=1), job_of([4, 4]), job_of([4, 4])
    for job in (low, first, second):
        queue.submit(job)
    assert cut(queue) == [first, second]


def test_a_waiting_job_rises_one_level_per_aging_period_until_it_runs() -> None:
    """Aging 1 s: a priority-3 job behind a stream of priority-0 ones is at level 1 after 2.999 s (the stream goes
    on first) and at level 0 after exactly 3 s, where, the oldest there, it runs next."""
    clock = Clock()
    queue = batcher(clock, size=1)
    patient = job_of([4], priority=3)
    queue.submit(patient)
    for now in (100.0, 101.0, 102.0, 102.999):
        clock.now = now
        stream = job_of([4])
        queue.submit(stream)
        assert cut(queue) == [stream]
    clock.now = 103.0
    queue.submit(newcomer := job_of([4]))
    assert cut(queue) == [patient]
    assert cut(queue) == [newcomer]


def test_waiting_buys_nothing_past_the_best_priority_queued() -> None:
    """Two jobs of one priority: the one that waited 10 s is not raised above the other, so the fill still goes
    shortest first (the small job completes in this batch), as without priorities."""
    clock = Clock()
    queue = batcher(clock, size=6)
    old = job_of([4] * 20)
    queue.submit(old)
    clock.now += 10
    small = job_of([4] * 3)
    queue.submit(small)
    batch = cut(queue)
    assert batch.count(small) == 3 and batch.count(old) == 3


# -- fair share by key ---------------------------------------------------------------------------------------


def test_a_keys_many_jobs_do_not_crowd_another_keys_job_out_of_the_next_batch() -> None:
    queue = batcher(Clock(), size=4)
    flood = [job_of([4], key="flood") for _ in range(20)]
    for job in flood:
        queue.submit(job)
    quiet = job_of([4], key="quiet")
    queue.submit(quiet)
    assert cut(queue) == [flood[0], quiet, flood[1], flood[2]]


def test_backlogged_keys_share_the_items_by_their_weights() -> None:
    queue = batcher(Clock(), size=8)
    light, heavy = job_of([4] * 200, key="light"), job_of([4] * 200, key="heavy", weight=3.0)
    queue.submit(light)
    queue.submit(heavy)
    taken = Counter(job.schedule.key for _ in range(10) for job in cut(queue))
    assert taken == {"heavy": 60, "light": 20}


def test_shares_are_counted_in_tokens_not_items() -> None:
    queue = batcher(Clock(), size=10)
    long, short = job_of([30] * 50, key="long"), job_of([10] * 50, key="short")
    queue.submit(long)
    queue.submit(short)
    taken = Counter(job.schedule.key for _ in range(4) for job in cut(queue))
    assert taken == {"short": 30, "long": 10}


def test_a_key_that_had_nothing_queued_banks_no_credit() -> None:
    """Key a ran alone for a while; key b, idle until now, starts at the virtual time being served, so from b's
    arrival on the two share the batches evenly instead of b taking every item until it has caught up."""
    queue = batcher(Clock(), size=8)
    queue.submit(busy := job_of([4] * 400, key="a"))
    for _ in range(20):
        cut(queue)
    queue.submit(job_of([4] * 400, key="b"))
    taken = Counter(job.schedule.key for _ in range(5) for job in cut(queue))
    assert taken == {"a": 20, "b": 20}
    assert busy._pending


def test_with_one_key_and_one_priority_the_order_is_arrival_then_shortest_first() -> None:
    queue = batcher(Clock(), size=6)
    old, new, small = job_of([4] * 10), job_of([4] * 10), job_of([4] * 2)
    for job in (old, new, small):
        queue.submit(job)
    assert cut(queue) == [old, new, small, small, old, old]


# -- deadlines -----------------------------------------------------------------------------------------------


def test_a_jobs_own_timeout_expires_it_and_it_never_runs() -> None:
    clock = Clock()
    queue = batcher(clock, size=1)
    queue.submit(blocker := job_of([4]))
    queue.submit(timed := job_of([4], timeout=2.0))
    assert cut(queue) == [blocker]
    clock.now += 2.0  # exactly at its limit: it stays
    queue.submit(other := job_of([4]))
    assert cut(queue) == [timed]
    queue.submit(late := job_of([4], timeout=2.0))
    clock.now += 2.001
    assert cut(queue) == [other]
    assert isinstance(late.error, QueueTimeout) and "more than 2 s" in str(late.error)
    assert late.started_at is None and not late._pending


def test_the_shorter_of_the_jobs_timeout_and_max_queue_wait_applies() -> None:
    clock = Clock()
    queue = batcher(clock, size=1, wait=5.0)
    queue.submit(job_of([4]))
    queue.submit(patient := job_of([4], timeout=10.0))
    queue.submit(hurried := job_of([4], timeout=1.0))
    cut(queue)
    clock.now += 5.5
    assert queue.expire(patient) and queue.expire(hurried)
    assert str(patient.error).endswith("more than 5 s in the queue before any of it ran")
    assert str(hurried.error).endswith("more than 1 s in the queue before any of it ran")


# -- model seconds -------------------------------------------------------------------------------------------


class Timed:
    """A backend whose forward returns one scalar per input."""

    name, kind, max_length = "timed", "bi-encoder", 512

    def forward(self, batch: list[Encoded]) -> list[torch.Tensor]:
        return [torch.tensor(float(item.cost)) for item in batch]


def test_the_worker_splits_each_batch_s_time_over_its_jobs_by_tokens() -> None:
    queue = batcher(Clock(), size=8)
    short, long = job_of([10, 10]), job_of([30, 30, 30])
    queue.submit(short)
    queue.submit(long)
    worker = ModelWorker(Timed(), next_batch=queue.next_batch, close=queue.close, on_death=queue.fail_all)  # type: ignore[arg-type]
    worker.start()
    worker.stop(10)
    busy = worker.stats.busy_seconds
    assert busy > 0 and short.done and long.done
    assert short.model_seconds == pytest.approx(busy * 20 / 110)
    assert long.model_seconds == pytest.approx(busy * 90 / 110)


# -- the wire ------------------------------------------------------------------------------------------------


def test_a_jobs_schedule_crosses_the_wire_to_the_model_host() -> None:
    schedule = Schedule(priority=-4, key="alice", weight=2.5, timeout=0.75)
    sent = wire.submit(3, [Encoded(token_array([1, 2, 3]))], schedule)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(sent), type=wire.Message)
    assert isinstance(back, wire.Submit) and wire.schedule_of(back) == schedule
