"""The worker thread with a scripted backend: a failing batch fails only its own jobs."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
import torch

from scorekit.batching import Batcher
from scorekit.errors import ModelFailure
from scorekit.jobs import Job
from scorekit.models.base import Encoded, token_array
from scorekit.worker import ModelWorker
from tests.unit.test_worker_death import worker_for


class ScriptedBackend:
    """Returns each input's length; raises on any batch that holds an input of length 13."""

    kind = "bi-encoder"
    name = "scripted"
    max_length = 64
    vocab_size = 100

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        if any(item.cost == 13 for item in batch):
            raise RuntimeError("injected model error")
        return [torch.tensor(float(item.cost)) for item in batch]


def run_jobs(*jobs: Job, batch_size: int) -> ModelWorker:
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=batch_size, max_queued_items=1000)
    worker = ModelWorker(
        ScriptedBackend(),  # type: ignore[arg-type]
        next_batch=batcher.next_batch,
        close=batcher.close,
        on_death=batcher.fail_all,
    )
    for job in jobs:
        batcher.submit(job)
    worker.start()
    worker.stop(timeout=5)
    return worker


def make_job(lengths: list[int], done: threading.Event) -> Job:
    return Job([Encoded(token_array([0] * n)) for n in lengths], notify=done.set)


def test_outputs_come_back_in_input_order() -> None:
    done = threading.Event()
    job = make_job([4, 1, 3], done)
    worker = run_jobs(job, batch_size=2)
    assert done.is_set() and job.error is None
    assert [float(x) for x in job.results if x is not None] == [4.0, 1.0, 3.0]
    assert worker.stats.items == 3 and worker.stats.batches == 2


def test_a_model_error_fails_only_the_jobs_in_that_batch() -> None:
    events = [threading.Event() for _ in range(2)]
    healthy, poisoned = make_job([2, 2], events[0]), make_job([13], events[1])
    worker = run_jobs(healthy, poisoned, batch_size=2)
    assert all(event.is_set() for event in events)
    assert isinstance(poisoned.error, ModelFailure)
    assert worker.stats.failed_batches >= 1
    assert worker.death is None


def test_a_failed_batch_does_not_stop_the_worker() -> None:
    first, second = threading.Event(), threading.Event()
    poisoned, later = make_job([13], first), make_job([5], second)
    worker = run_jobs(poisoned, later, batch_size=1)
    assert isinstance(poisoned.error, ModelFailure)
    assert later.error is None and later.results[0] is not None and float(later.results[0]) == 5.0
    assert worker.stats.batches == 1


class SideBySideBackend:
    """Each forward waits at a barrier for ``parties - 1`` other forwards to reach it, and records the intra-op
    threads it had: with two parties it completes only when two batches run at once."""

    kind = "bi-encoder"
    name = "side-by-side"
    max_length = 64
    vocab_size = 100

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=30)
        self.threads: list[int] = []

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        self.threads.append(torch.get_num_threads())
        self.barrier.wait()
        return [torch.tensor(float(item.cost)) for item in batch]


@pytest.fixture
def two_intra_op_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_intra_op_threads")
def test_two_threads_run_two_batches_at_once_and_one_that_joins_takes_its_share() -> None:
    backend = SideBySideBackend(parties=2)
    worker, batcher = worker_for(backend, batch_size=2, threads=2)
    done = threading.Event()
    job = make_job([1, 2, 3, 4, 5, 6, 7, 8], done)  # four batches of two, met in pairs at the barrier
    batcher.submit(job)
    worker.start()
    assert done.wait(30) and job.error is None
    worker.stop(timeout=5)
    assert not worker.alive
    assert [float(x) for x in job.results if x is not None] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert worker.stats.items == 8 and worker.stats.batches == 4 and worker.stats.most_busy == 2
    # The second of a pair to start runs on one of the two intra-op threads; the first may have started alone.
    assert min(backend.threads) == 1 and max(backend.threads) <= 2


@pytest.mark.usefixtures("two_intra_op_threads")
def test_a_lone_batch_keeps_every_intra_op_thread() -> None:
    backend = SideBySideBackend(parties=1)  # no waiting
    worker, batcher = worker_for(backend, batch_size=4, threads=2)
    done = threading.Event()
    batcher.submit(make_job([3, 4], done))  # one batch: the other thread has nothing to run beside it
    worker.start()
    assert done.wait(30)
    worker.stop(timeout=5)
    assert backend.threads == [2] and worker.stats.most_busy == 1


def test_a_worker_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        ModelWorker(ScriptedBackend(), next_batch=lambda: None, close=lambda: None, on_death=lambda _: None, threads=0)  # type: ignore[arg-type]
