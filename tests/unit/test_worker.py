"""The worker thread with a scripted backend: a failing batch fails only its own jobs."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from scorekit.batching import Batcher
from scorekit.errors import ModelFailure
from scorekit.jobs import Job
from scorekit.models.base import Encoded, token_array
from scorekit.worker import ModelWorker


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
