"""The batcher on its own: token budget, fairness, cancellation and backpressure."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scorekit.batching import BatchCost, Batcher, QueueFull
from scorekit.engine import Engine
from scorekit.jobs import Job
from scorekit.model_host import LocalHost
from scorekit.model_job import ModelJob
from scorekit.models import BiEncoderBackend, CausalLMBackend, CrossEncoderBackend, LLMRerankerBackend
from scorekit.models.base import Backend, Encoded, token_array
from scorekit.settings import EngineConfig


def job_of(lengths: list[int]) -> Job:
    return Job([Encoded(token_array(range(n))) for n in lengths], notify=lambda: None)


def drain(batcher: Batcher) -> list[list[tuple[int, int]]]:
    """Every batch as (job id, index) pairs, until the queue is empty."""
    batches = []
    while batcher.queued:
        batch = batcher.next_batch()
        assert batch is not None
        batches.append([(id(item.job), item.index) for item in batch])
    return batches


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(st.lists(st.integers(1, 64), min_size=1, max_size=40), min_size=1, max_size=6),
    budget=st.integers(64, 1024),
    size=st.integers(1, 32),
)
def test_every_item_runs_once_within_the_budget(jobs: list[list[int]], budget: int, size: int) -> None:
    batcher = Batcher(max_batch_tokens=budget, max_batch_size=size, max_queued_items=10_000)
    submitted = [job_of(lengths) for lengths in jobs]
    for job in submitted:
        batcher.submit(job)
    seen = []
    while batcher.queued:
        batch = batcher.next_batch()
        assert batch is not None and 1 <= len(batch) <= size
        padded = max(item.encoded.cost for item in batch) * len(batch)
        assert len(batch) == 1 or padded <= budget
        seen.extend((id(item.job), item.index) for item in batch)
    expected = [(id(job), i) for job in submitted for i in range(len(job.inputs))]
    assert sorted(seen) == sorted(expected)


def test_a_small_job_joins_the_next_batch_while_a_large_one_runs() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=8, max_queued_items=10_000)
    large, small = job_of([10] * 5000), job_of([10])
    batcher.submit(large)
    first = batcher.next_batch()
    assert first is not None and {item.job for item in first} == {large}
    batcher.submit(small)
    second = batcher.next_batch()
    assert second is not None and small in {item.job for item in second}


def test_after_one_item_each_equal_jobs_fill_the_batch_in_arrival_order() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=6, max_queued_items=10_000)
    old, new = job_of([5] * 10), job_of([5] * 10)
    batcher.submit(old)
    batcher.submit(new)
    batch = batcher.next_batch()
    assert batch is not None
    assert [item.job is old for item in batch].count(True) == 5


def test_a_small_job_completes_in_one_batch_beside_a_large_one() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=8, max_queued_items=10_000)
    large, small = job_of([10] * 500), job_of([10, 10, 10])
    batcher.submit(large)
    batcher.submit(small)
    batch = batcher.next_batch()
    assert batch is not None
    assert [item.job for item in batch].count(small) == 3


def test_a_job_runs_in_length_order() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=2, max_queued_items=100)
    job = job_of([30, 5, 20, 1])
    batcher.submit(job)
    order = [index for batch in drain(batcher) for _, index in batch]
    assert [job.inputs[i].cost for i in order] == [1, 5, 20, 30]


def test_cancel_drops_queued_items_before_they_run() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=4, max_queued_items=100)
    keep, drop = job_of([3] * 4), job_of([3] * 10)
    batcher.submit(keep)
    batcher.submit(drop)
    assert batcher.cancel(drop) == 10
    assert batcher.queued == 4
    assert all(job_id == id(keep) for batch in drain(batcher) for job_id, _ in batch)


def test_past_the_queue_limit_submit_refuses_without_queueing() -> None:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=4, max_queued_items=5)
    batcher.submit(job_of([1] * 4))
    with pytest.raises(QueueFull):
        batcher.submit(job_of([1] * 2))
    assert batcher.queued == 4


def test_close_wakes_the_worker_once_the_queue_is_drained() -> None:
    batcher = Batcher(max_batch_tokens=100, max_batch_size=4, max_queued_items=10)
    batcher.submit(job_of([1]))
    batcher.close()
    assert batcher.next_batch() is not None
    assert batcher.next_batch() is None


def test_fail_all_answers_every_queued_job_and_closes() -> None:
    batcher = Batcher(max_batch_tokens=100, max_batch_size=4, max_queued_items=100)
    jobs = [job_of([1, 2]), job_of([3])]
    for job in jobs:
        batcher.submit(job)
    error = RuntimeError("worker died")
    batcher.fail_all(error)
    assert all(job.done and job.error is error for job in jobs)
    assert batcher.queued == 0 and batcher.next_batch() is None
    with pytest.raises(QueueFull):
        batcher.submit(job_of([1]))


def test_a_model_job_keeps_copies_of_its_outputs_not_views_of_the_batch_result() -> None:
    """Each delivered output is copied into the job's one tensor, so a batch's result can be freed once
    the batch is delivered (views kept for a long request fragmented the heap; docs/benchmarks.md 6b)."""
    job = ModelJob([Encoded(token_array([1, 2])) for _ in range(3)], notify=lambda: None)
    first, second = torch.randn(2, 4), torch.randn(1, 4)
    for index, row in ((2, first[0]), (0, first[1]), (1, second[0])):
        job.deliver(index, row)
    assert job.done
    results = job.outputs()
    torch.testing.assert_close(torch.stack(results), torch.stack([first[1], second[0], first[0]]))
    batch_storages = {first.untyped_storage().data_ptr(), second.untyped_storage().data_ptr()}
    assert all(result.untyped_storage().data_ptr() not in batch_storages for result in results)
    # Until the job is done it holds its one tensor, not a view per output (made on the worker thread).
    assert len({id(result) for result in job.results}) == 1


def test_a_model_job_keeps_an_output_of_another_shape_as_it_came() -> None:
    job = ModelJob([Encoded(token_array([1])) for _ in range(2)], notify=lambda: None)
    job.deliver(0, torch.zeros(3))
    odd = torch.ones(5)
    job.deliver(1, odd)
    zeros, kept = job.outputs()
    assert kept is odd
    assert zeros.tolist() == [0.0, 0.0, 0.0]


def fitted(fixed: float, per_token: float) -> BatchCost:
    """A cost model that already knows its fit, as if the worker had reported batches of that cost."""
    cost = BatchCost()
    cost.fit = (fixed, per_token)
    return cost


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def budgeted(clock: Clock, efficiency: float | None = 0.8, *, size: int = 64, least: int = 1) -> Batcher:
    """A batcher whose cost fit is 10 ms fixed and 1 ms per token: at 80% efficiency, 40 tokens, 50 ms."""
    return Batcher(
        max_batch_tokens=10_000,
        max_batch_size=size,
        max_queued_items=10_000,
        batch_efficiency=efficiency,
        min_batch_size=least,
        cost=fitted(0.010, 0.001),
        clock=clock,
    )


def test_batch_cost_fits_the_fixed_and_the_per_token_cost() -> None:
    cost = BatchCost()
    cost.observe(1000, 0.11)
    cost.observe(1050, 0.115)
    assert cost.fit is None  # sizes this alike cannot tell the fixed cost from the per-token one
    cost.observe(500, 0.06)
    assert cost.fit is not None
    assert cost.fit == pytest.approx((0.01, 0.0001))
    cost.observe(500, 30.0)  # a stalled batch: a fit through it would have no fixed cost
    assert cost.fit == pytest.approx((0.01, 0.0001))


def test_batch_size_follows_the_efficiency_budget() -> None:
    """fixed 10 ms, 1 ms per token: keeping 80% of an endless batch's throughput takes 4 x 10 / 1 = 40 tokens,
    keeping 50% takes 10; without a budget the batch is what the token and size limits allow."""
    for efficiency, items in ((0.8, 4), (0.5, 1), (None, 8)):
        batcher = budgeted(Clock(), efficiency, size=8)  # time stands still: the first batch has the whole budget
        batcher.submit(job_of([10] * 100))
        sizes = {len(batch) for batch in drain(batcher)[:-1]}  # the last one takes what is left
        assert sizes == {items}


def test_a_batch_of_the_budget_holds_at_least_min_batch_size_items() -> None:
    """At 50% the fit asks for 10 tokens (one item); the floor of 3 items wins. The first batch carries the
    new job within what is left of its budget, which the floor does not lengthen."""
    batcher = budgeted(Clock(), 0.5, size=8, least=3)
    batcher.submit(job_of([10] * 100))
    sizes = [len(batch) for batch in drain(batcher)]
    assert sizes[0] == 1 and set(sizes[1:-1]) == {3}


def test_a_small_job_queued_beside_a_big_one_completes_in_the_next_batch() -> None:
    """However little of its budget is left, the batch after a small job arrives holds all of it, beside
    one item of the big job (which never starves)."""
    clock = Clock()
    batcher = budgeted(clock)
    big = job_of([10] * 1000)
    batcher.submit(big)
    assert len(batcher.next_batch() or []) == 4
    small = job_of([10] * 3)
    batcher.submit(small)
    clock.now = 1.0  # long past the 50 ms a batch of the budget takes: nothing left of the small job's budget
    batch = batcher.next_batch()
    assert batch is not None
    assert [item.job for item in batch].count(small) == 3
    assert [item.job for item in batch].count(big) == 1


def test_the_batch_that_carries_a_new_job_ends_within_one_batch_time_of_its_arrival() -> None:
    """A batch of the budget takes 10 / (1 - 0.8) = 50 ms. The small job came 30 ms before the cut, so its
    batch gets 20 ms: 10 tokens beyond the fixed cost, one item of the big job, as its turn already gives."""
    clock = Clock()
    batcher = budgeted(clock)
    big = job_of([10] * 1000)
    batcher.submit(big)
    batcher.next_batch()
    small = job_of([1])
    batcher.submit(small)
    clock.now = 0.030
    batch = batcher.next_batch()
    assert batch is not None and sorted(item.job is small for item in batch) == [False, True]
    clock.now = 0.060
    assert len(batcher.next_batch() or []) == 4  # nobody new waits: a full batch of the budget again


class TraitsOf:
    """A backend that is only a backend class's kind and traits: what the engine reads to size its batches."""

    name = "traits-only"
    max_length = 8
    vocab_size = 8

    def __init__(self, backend: type[Backend]) -> None:
        self.kind = backend.kind
        self.batch_cost_follows_tokens = backend.batch_cost_follows_tokens

    def forward(self, batch: list[Encoded]) -> list[torch.Tensor]:
        raise AssertionError("never run")


class Silent:
    def batch(self, size: int, tokens: int, seconds: float) -> None: ...
    def dropped(self, items: int) -> None: ...
    def tokenized(self, seconds: float) -> None: ...
    def waited(self, seconds: float) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def cancelled(self, stage: str) -> None: ...
    def failed(self, reason: str) -> None: ...
    def model_seconds(self, key: str, seconds: float) -> None: ...


@pytest.mark.parametrize(
    ("backend", "budget"),
    [(BiEncoderBackend, 0.8), (CrossEncoderBackend, 0.8), (CausalLMBackend, 0.8), (LLMRerankerBackend, None)],
)
def test_batches_are_cut_by_the_cost_fit_except_an_llm_rerankers(backend: type[Backend], budget: float | None) -> None:
    """An LLM reranker's prompts share a prefix that runs once per batch, so its batch cost is not the fixed plus
    per-token fit the budget cuts by: it says so (``batch_cost_follows_tokens``), and its batches fill to the caps."""
    config = EngineConfig(max_batch_tokens=16384, batch_efficiency=0.8)
    host = Engine(TraitsOf(backend), config, observer=Silent()).host
    assert isinstance(host, LocalHost)  # an engine given no host runs its batches in this process
    assert host.batcher.batch_efficiency == budget


def test_the_small_job_lane_takes_small_jobs_only_and_no_thread_misses_its_wake_up() -> None:
    """A lane's thread (``next_batch(small=N)``) cuts from jobs of at most N inputs and waits beside larger
    ones; a job queued while both a lane's thread and a plain one wait wakes the one that can take it."""
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=64, max_queued_items=10_000)
    large, small = job_of([10] * 20), job_of([10] * 3)
    results: dict[str, list[int]] = {}

    def take(name: str, small_only: int | None) -> None:
        batch = batcher.next_batch(small=small_only)
        results[name] = [] if batch is None else [id(item.job) for item in batch]

    # Daemons: a thread that a broken batcher never wakes fails the test instead of hanging the interpreter's exit.
    lane = threading.Thread(target=take, args=("lane", 8), daemon=True)
    plain = threading.Thread(target=take, args=("plain", None), daemon=True)
    lane.start()
    plain.start()
    batcher.submit(large)  # both threads wait on the same condition: the plain one must get it
    plain.join(10)
    assert not plain.is_alive() and results["plain"] == [id(large)] * 20
    assert lane.is_alive()  # the lane waits beside a large job
    batcher.submit(small)
    lane.join(10)
    assert not lane.is_alive() and results["lane"] == [id(small)] * 3
    batcher.submit(job_of([10] * 9))  # one input over the lane's size: not the lane's
    lane = threading.Thread(target=take, args=("lane", 8), daemon=True)
    lane.start()
    lane.join(0.2)
    assert lane.is_alive()
    batcher.close()
    lane.join(10)
    assert results["lane"] == []  # closed: the lane's thread ends without taking the large job
