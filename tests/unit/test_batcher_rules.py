"""The batcher's rules that the mutation audit of issue 28 found unguarded (E3-E7 in docs/invariants.md).

Each changes what a client sees: an input longer than ``--max-batch-tokens`` would never run (its request hangs);
a request nearly done would wait behind a newer one that is smaller in all but what it has left; a request of
exactly ``--small-job-lane`` inputs would wait for a large request's batch; a cost fit that forgets nothing would
size batches by how the machine ran long ago; and a budget that gives way without completing anyone makes the
batch that carries a newcomer longer than it may be. The batcher runs without a worker here: a test cuts its
batches by hand, on a fake clock where time matters, so every count is exact.
"""

from __future__ import annotations

import pytest
import torch

from scorekit.batching import BatchCost, Batcher
from scorekit.jobs import WorkItem
from scorekit.model_job import ModelJob
from scorekit.models.base import Encoded, token_array

ModelItem = WorkItem[Encoded, torch.Tensor]


def job_of(lengths: list[int]) -> ModelJob:
    return ModelJob([Encoded(token_array([0] * n)) for n in lengths], notify=lambda: None)


def cut(batcher: Batcher) -> list[ModelItem]:
    batch = batcher.next_batch()
    assert batch is not None
    return batch


def count(batch: list[ModelItem], job: ModelJob) -> int:
    return sum(item.job is job for item in batch)


def test_E3_an_input_longer_than_the_token_limit_runs_in_a_batch_of_its_own() -> None:
    """``--max-batch-tokens`` may be set below the model's longest input: such an input cannot share a batch, and
    it still runs, alone, instead of being refused by every cut (its request would wait for ever)."""
    batcher = Batcher(max_batch_tokens=8, max_batch_size=4, max_queued_items=100)
    job = job_of([20, 3, 30])
    batcher.submit(job)
    batches = []
    for _ in range(5):  # bounded: a batcher that refuses the long inputs would cut empty batches for ever
        if not batcher.queued:
            break
        batches.append(sorted(item.encoded.cost for item in cut(batcher)))
    assert batches == [[3], [20], [30]]


def test_E4_fill_goes_to_the_request_with_the_fewest_items_left() -> None:
    """After one item of each, a batch fills from the request with the fewest items *left*, not the one that
    was smallest when it came: a large request with its last two items to go completes before a newer request
    of five is filled, so it is not held back by every smaller request that arrives at its end."""
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=4, max_queued_items=100)
    old = job_of([5] * 10)
    batcher.submit(old)
    assert count(cut(batcher), old) == 4
    assert count(cut(batcher), old) == 4  # two left
    new = job_of([5] * 5)
    batcher.submit(new)
    batch = cut(batcher)
    assert (count(batch, old), count(batch, new)) == (2, 2)  # one of each, then the old one's last
    assert not old._pending


@pytest.mark.parametrize("lane", [1, 8])
def test_E5_a_request_of_exactly_the_lanes_size_rides_the_lane_and_one_more_does_not(lane: int) -> None:
    """``--small-job-lane N``: a request of N model inputs is small (the lane's thread takes it), one of N + 1 is
    not. The batcher is closed first, so the lane's ``next_batch`` returns at once: the request's items, or None
    when nothing is the lane's."""
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=64, max_queued_items=100)
    edge = job_of([4] * lane)
    batcher.submit(edge)
    batcher.close()
    batch = batcher.next_batch(small=lane)
    assert batch is not None and count(batch, edge) == lane == len(batch)
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=64, max_queued_items=100)
    over = job_of([4] * (lane + 1))
    batcher.submit(over)
    batcher.close()
    assert batcher.next_batch(small=lane) is None
    assert batcher.queued == lane + 1  # left for the worker's own threads
    assert count(cut(batcher), over) == lane + 1


def test_E6_the_cost_fit_follows_the_recent_batches() -> None:
    """The batches' cost is fitted with the latest weighing most: after a machine slows down (twice the fixed
    and per-token cost, another process taking its cores), the fit is the new cost, not an average with what
    the batches cost before, and batches are sized by what they cost now."""
    cost = BatchCost()
    for n in range(50):
        tokens = 500 if n % 2 else 1000
        cost.observe(tokens, 0.01 + 1e-4 * tokens)
    assert cost.fit == pytest.approx((0.01, 1e-4), rel=1e-6)
    for n in range(200):
        tokens = 500 if n % 2 else 1000
        cost.observe(tokens, 0.02 + 2e-4 * tokens)
    assert cost.fit == pytest.approx((0.02, 2e-4), rel=1e-3)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_E7_the_budget_gives_way_only_to_complete_the_smallest_request() -> None:
    """With ``batch_efficiency`` the batch that carries a newcomer stops at its budget, except to complete the
    request with the fewest items left when all of it fits beside what the batch already holds. When it does not
    fit, the budget holds: the batch is not lengthened for a request that is split anyway.

    Fit: 10 ms fixed, 1 ms per token, so at 80% a batch holds 40 tokens (four inputs of 10). Three requests of
    three are queued and their budget is spent (the clock is long past it): the first cut takes one of each
    (30 tokens); the smallest request's other two would make 50, so the batch stops at those three."""
    clock = Clock()
    cost = BatchCost()
    cost.fit = (0.010, 0.001)
    batcher = Batcher(
        max_batch_tokens=10_000,
        max_batch_size=64,
        max_queued_items=100,
        batch_efficiency=0.8,
        min_batch_size=1,
        cost=cost,
        clock=clock,
    )
    jobs = [job_of([10] * 3) for _ in range(3)]
    for job in jobs:
        batcher.submit(job)
    clock.now = 1.0
    batch = cut(batcher)
    assert [count(batch, job) for job in jobs] == [1, 1, 1]
