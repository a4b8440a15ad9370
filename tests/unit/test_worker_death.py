"""The worker and a job at their edges: a dying worker answers everyone, a job is answered once, waste is counted.

Each test pins a promise that the mutation check (``make mutants``) found unguarded: every request waiting
on a dead worker gets its answer (the ones in the fatal batch and the queued ones), ``Job.notify`` runs
exactly once even when later items of a failed job still come back, the items of a job cancelled while
its batch ran are counted as wasted, and the batch observer is told the padded token count.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from scorekit.batching import Batcher, QueueFull
from scorekit.errors import ModelFailure
from scorekit.jobs import Job
from scorekit.models.base import Encoded, token_array
from scorekit.worker import ModelWorker

WAIT = 10.0  # seconds; only a hang reaches it


class Backend:
    """Returns each input's length. A batch holding length 13 raises RuntimeError, length 99 SystemExit;
    with ``gate`` set, every batch first waits for it (so a test can act while a batch runs)."""

    kind = "bi-encoder"
    name = "scripted"
    max_length = 128
    vocab_size = 100

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.entered = threading.Event()

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT), "the test never opened the gate"
        costs = [item.cost for item in batch]
        if 99 in costs:
            raise SystemExit("the model process is going away")
        if 13 in costs:
            raise RuntimeError("injected model error")
        return [torch.tensor(float(cost)) for cost in costs]


class Notified:
    """A job's ``notify``: counts the calls and keeps the error the job had at the first one."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_error: BaseException | None = None
        self.job: Job | None = None

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == 1 and self.job is not None:
            self.first_error = self.job.error


def job_of(lengths: list[int]) -> tuple[Job, Notified]:
    notified = Notified()
    job = Job([Encoded(token_array([0] * n)) for n in lengths], notify=notified)
    notified.job = job
    return job, notified


def submitted(batcher: Batcher, *lengths: list[int]) -> list[tuple[Job, Notified]]:
    """A job per list of input lengths, queued in that order."""
    jobs = [job_of(each) for each in lengths]
    for job, _ in jobs:
        batcher.submit(job)
    return jobs


def worker_for(backend: Backend, batch_size: int, **kwargs: object) -> tuple[ModelWorker, Batcher]:
    """A worker fed by a batcher, wired as the engine wires them; the test submits to the batcher."""
    batcher = Batcher(max_batch_tokens=10_000, max_batch_size=batch_size, max_queued_items=1000)
    worker = ModelWorker(
        backend,  # type: ignore[arg-type]
        next_batch=batcher.next_batch,
        close=batcher.close,
        on_death=batcher.fail_all,
        **kwargs,  # type: ignore[arg-type]
    )
    return worker, batcher


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_a_dying_worker_answers_the_batch_it_ran_and_every_queued_job() -> None:
    worker, batcher = worker_for(Backend(), batch_size=2)
    # One item of each job per batch first: the fatal batch holds `fatal` and `beside`; `queued` waits.
    (fatal, fatal_notified), (beside, beside_notified), (queued, queued_notified) = submitted(
        batcher, [99], [4], [5, 6]
    )
    worker.start()
    worker.join(WAIT)
    assert not worker.alive
    assert isinstance(worker.death, SystemExit)
    for job, notified in ((fatal, fatal_notified), (beside, beside_notified), (queued, queued_notified)):
        assert job.done and isinstance(job.error, ModelFailure) and "worker died" in str(job.error)
        assert notified.calls == 1
    with pytest.raises(QueueFull):  # and nothing new queues for the dead worker
        batcher.submit(job_of([1])[0])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_a_thread_that_dies_takes_the_others_with_it_and_everyone_is_answered() -> None:
    gate = threading.Event()
    backend = Backend(gate)
    worker, batcher = worker_for(backend, batch_size=1, threads=2)
    (beside, beside_notified), (fatal, fatal_notified), (queued, queued_notified) = submitted(
        batcher, [4], [99], [5, 6]
    )
    worker.start()
    gate.set()  # both threads hold a batch or are about to: `beside`'s, and the fatal one
    worker.join(WAIT)
    assert not any(thread.is_alive() for thread in worker._threads)  # the other thread ended too
    assert isinstance(worker.death, SystemExit) and not worker.alive
    assert fatal.done and isinstance(fatal.error, ModelFailure) and "worker died" in str(fatal.error)
    # The others ran beside the fatal batch and got their answers, or were failed with it: each answered once.
    for job in (beside, queued):
        assert job.done and (isinstance(job.error, ModelFailure) or None not in job.results)
    assert (beside_notified.calls, fatal_notified.calls, queued_notified.calls) == (1, 1, 1)
    with pytest.raises(QueueFull):
        batcher.submit(job_of([1])[0])


def test_a_failed_job_is_answered_once_even_when_its_later_items_come_back() -> None:
    worker, batcher = worker_for(Backend(), batch_size=1)
    # In length order: 13 fails the job, then 20 still runs and comes back.
    job, notified = job_of([20, 13])
    batcher.submit(job)
    worker.start()
    worker.stop(timeout=WAIT)
    assert notified.calls == 1
    assert isinstance(job.error, ModelFailure)
    assert job.results == [None, None]  # no result beside the error


def test_a_second_failure_keeps_the_first_error_and_does_not_notify_again() -> None:
    worker, batcher = worker_for(Backend(), batch_size=1)
    job, notified = job_of([13, 13])
    batcher.submit(job)
    worker.start()
    worker.stop(timeout=WAIT)
    assert worker.stats.failed_batches == 2
    assert notified.calls == 1
    assert job.error is notified.first_error


def test_items_of_a_job_cancelled_while_its_batch_runs_count_as_wasted() -> None:
    gate = threading.Event()
    backend = Backend(gate)
    worker, batcher = worker_for(backend, batch_size=1)
    job, _ = job_of([3, 4])
    batcher.submit(job)
    worker.start()
    try:
        assert backend.entered.wait(WAIT)
        assert batcher.cancel(job) == 1  # the running item cannot be taken back; the other can
        assert job.cancelled
    finally:
        gate.set()
        worker.stop(timeout=WAIT)
    assert worker.stats.items == 1
    assert worker.stats.items_of_cancelled_jobs == 1


def test_the_batch_observer_gets_the_padded_token_count() -> None:
    seen: list[tuple[int, int]] = []
    times: list[float] = []

    def observe(items: int, tokens: int, seconds: float) -> None:
        seen.append((items, tokens))
        times.append(seconds)

    worker, batcher = worker_for(Backend(), batch_size=2, on_batch=observe)
    job, _ = job_of([3, 5])
    batcher.submit(job)
    worker.start()
    worker.stop(timeout=WAIT)
    assert seen == [(2, 10)]  # two items padded to the longest (5)
    assert len(times) == 1 and times[0] >= 0  # the forward's time, from the worker's own clock
