"""The engine's accounting rules (E1, E2 in docs/invariants.md), with a scripted backend and a real worker thread.

E1: the count of admitted requests (``max_concurrent_requests``) is given back however a request ends: a model
error, a cancellation while queued, a refusal while tokenizing. A count kept by any of them shrinks the limit
for good, so after enough failures the server refuses everything with 503.

E2: the requests a dead worker leaves behind (the one in the fatal batch and the queued ones) are counted in
``/metrics`` as ``worker_died``, not as ``model_error``: ``WorkerDied`` is a ``ModelFailure`` (both answer 500),
so which label a failure gets depends on the worker failing it with its own type and the engine testing for that
type first.

E13: a task the backend cannot do is refused (``Unsupported``, a 404) before any work, whatever else the backend
can do: the engine resolves what a backend can do once, when it is made.

The mutation audit of issue 28 found E1 and E2 unguarded (mutants E01-E04). The worker is held on a gate where a test
needs a request queued, never on a sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import anyio
import anyio.to_thread
import pytest
import torch

from scorekit.engine import Engine
from scorekit.errors import InvalidRequest, ModelFailure, Overloaded, Unsupported, WorkerDied
from scorekit.load import LoadCounter
from scorekit.metrics import Metrics
from scorekit.models.base import Checkpoint, Encoded, Encoding, Plan, token_array
from scorekit.settings import EngineConfig
from scorekit.tasks import LabelQuery
from tests.unit.test_batching import Silent

WAIT = 30.0  # seconds; only a hang reaches it
MODEL_ERROR, DEATH, HELD = 13, 99, 7  # input lengths the backend treats specially


class Backend:
    """Returns each input's length. A batch holding length 13 raises RuntimeError (a model error), 99 raises
    SystemExit (the worker thread dies); one holding 7 or 99 first waits for ``gate``."""

    kind = "bi-encoder"
    name = "scripted"
    max_length = 128
    vocab_size = 100
    batch_cost_follows_tokens = True

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        costs = [item.cost for item in batch]
        if HELD in costs or DEATH in costs:
            self.entered.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
        if DEATH in costs:
            raise SystemExit("the model process is going away")
        if MODEL_ERROR in costs:
            raise RuntimeError("injected model error")
        return [torch.tensor(float(cost)) for cost in costs]


def plan(*lengths: int, refuse: bool = False) -> Plan[list[float]]:
    """A request of one input per length; with ``refuse``, tokenizing refuses it (a 400, as a bad field is)."""

    def encode(checkpoint: Checkpoint) -> Encoding[list[float]]:
        if refuse:
            raise InvalidRequest("refused while tokenizing")
        return Encoding([Encoded(token_array([0] * n)) for n in lengths], finish)

    def finish(outputs: list[torch.Tensor]) -> list[float]:
        return [float(output) for output in outputs]

    return Plan(len(lengths), sum(lengths), encode)


def engine_with(backend: Backend, observer: object, **limits: int) -> Engine:
    """One worker thread and batches of one item (so which request is in which batch is fixed), no lane."""
    config = EngineConfig(max_batch_tokens=10_000, max_batch_size=1, batch_efficiency=None, small_job_lane=0, **limits)
    return Engine(backend, config, observer=observer)  # type: ignore[arg-type]


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition``, within WAIT seconds: it turns true on the event loop, where a request is queued,
    so polling it costs nothing but the loop's turns."""
    with anyio.fail_after(WAIT):
        while not condition():  # noqa: ASYNC110  # nothing to wait on: the batcher has no event for the loop
            await anyio.sleep(0.001)


def test_E1_admission_is_given_back_however_a_request_ends() -> None:
    """With room for two requests at once, three model errors, three requests cancelled while queued and three
    refused while tokenizing each give their place back: a request after all nine is admitted and answered."""
    backend = Backend()
    engine = engine_with(backend, Silent(), max_concurrent_requests=2)
    engine.start()
    try:

        async def main() -> None:
            for _ in range(3):
                with pytest.raises(ModelFailure):
                    await engine.execute(plan(MODEL_ERROR))
                assert engine.active_requests == 0
            # Hold the worker on a batch, so a request stays queued until it is cancelled.
            async with anyio.create_task_group() as holder:
                holder.start_soon(engine.execute, plan(HELD))
                assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)
                for _ in range(3):
                    async with anyio.create_task_group() as group:
                        group.start_soon(engine.execute, plan(5))
                        await until(lambda: engine.snapshot().queued_items == 1)
                        group.cancel_scope.cancel()
                    assert engine.active_requests == 1  # the held one only
                backend.gate.set()
            for _ in range(3):
                with pytest.raises(InvalidRequest):
                    await engine.execute(plan(3, refuse=True))
            assert engine.active_requests == 0
            with anyio.fail_after(WAIT):
                assert await engine.execute(plan(4, 2)) == [4.0, 2.0]

        anyio.run(main)
    finally:
        backend.gate.set()
        engine.stop(WAIT)


def test_E1_the_limit_itself_still_refuses() -> None:
    """The other side of E1: while the admitted requests are in flight, one more is refused (503)."""
    backend = Backend()
    engine = engine_with(backend, Silent(), max_concurrent_requests=1)
    engine.start()
    try:

        async def main() -> None:
            async with anyio.create_task_group() as group:
                group.start_soon(engine.execute, plan(HELD))
                assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)
                with pytest.raises(Overloaded):
                    await engine.execute(plan(4))
                backend.gate.set()
            assert engine.active_requests == 0

        anyio.run(main)
    finally:
        backend.gate.set()
        engine.stop(WAIT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_E2_a_dead_workers_requests_are_counted_as_worker_died() -> None:
    """A model error is ``model_error``; when the worker dies, the request whose batch killed it and the one
    queued behind it are both ``worker_died`` in /metrics, and both are answered with ``WorkerDied``."""
    metrics = Metrics(LoadCounter(), lambda: [])
    backend = Backend()
    engine = engine_with(backend, metrics.model("m"))
    engine.start()
    errors: list[BaseException] = []

    async def fails(lengths: tuple[int, ...]) -> None:
        with pytest.raises(ModelFailure) as caught:
            await engine.execute(plan(*lengths))
        errors.append(caught.value)

    try:

        async def main() -> None:
            with anyio.fail_after(WAIT):
                await fails((MODEL_ERROR,))
                async with anyio.create_task_group() as group:
                    group.start_soon(fails, (DEATH,))
                    assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)
                    group.start_soon(fails, (5, 6))
                    await until(lambda: engine.snapshot().queued_items == 2)  # queued behind the fatal batch
                    backend.gate.set()

        anyio.run(main)
    finally:
        backend.gate.set()
        engine.stop(WAIT)
    assert not engine.ready
    health = engine.health
    assert not health.ready and isinstance(health.death, SystemExit)
    model_error, *dead = errors
    assert not isinstance(model_error, WorkerDied)
    assert len(dead) == 2 and all(isinstance(error, WorkerDied) for error in dead)

    def failed(reason: str) -> float | None:
        return metrics.registry.get_sample_value("scorekit_requests_failed_total", {"model": "m", "reason": reason})

    assert (failed("model_error"), failed("worker_died")) == (1.0, 2.0)


class PairsOnly(Backend):
    """Scores pairs and nothing else."""

    def plan_pairs(self, *request: object) -> Plan[list[float]]:
        return plan(4)


class LabelsToo(PairsOnly):
    """Scores pairs and label tokens."""

    def plan_labels(self, query: LabelQuery) -> Plan[list[float]]:
        return plan(*(len(item) for item in query.items))


def test_E13_a_task_the_backend_cannot_do_is_refused_before_any_work() -> None:
    """A pair scorer asked for label scores is refused with a message naming the model and the task, and none of
    the request runs; one that declares label scoring too is served."""
    query = LabelQuery(query="q", items=["ab", "abc"], label_token_ids=[1])
    refused, served = (engine_with(backend, Silent()) for backend in (PairsOnly(), LabelsToo()))
    refused.start()
    served.start()
    try:

        async def main() -> object:
            with pytest.raises(Unsupported, match="bi-encoder model 'scripted' cannot do label-token scoring"):
                await refused.label_scores(query)
            with anyio.fail_after(WAIT):
                return await served.label_scores(query)

        assert anyio.run(main) == [2.0, 3.0]
        after = refused.snapshot()
        assert after.idle and after.worker.items == 0
    finally:
        refused.stop(WAIT)
        served.stop(WAIT)
