"""A real model host process, driven through its client as the engine drives it: what it computes, what it never
runs, how its death, its load failure and its front end's departure are seen. Every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from scorekit.batching import QueueFull
from scorekit.errors import WorkerDied
from scorekit.host import wire
from scorekit.host.channel import Channel
from scorekit.host.client import HostClient, HostStartError
from scorekit.models import load_spec
from scorekit.models.base import Embedder, Encoded, PairScorer, no_checkpoint, token_array
from scorekit.settings import EngineConfig, ModelSpec
from scorekit.tasks import EmbedOptions, PairOptions
from tests.host.conftest import DOCUMENTS, START, WAIT, Recorder, Waited, hosted
from tests.tiny_models import build_qwen3_reranker

# One item per batch and no small-job lane: a job queued behind another waits for every item of it.
ONE_AT_A_TIME = EngineConfig(max_batch_tokens=4096, max_batch_size=1, small_job_lane=0)
# The shared host's queue limit: the abort test's two jobs fill it exactly.
QUEUE_LIMIT = 304


def _close_to(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert row.shape == want.shape and row.dtype == want.dtype
        assert torch.allclose(row, want, atol=1e-5, rtol=0)


@dataclass
class Shared:
    """One host for the tests that neither kill nor stop it (a host start costs seconds of imports): each test
    reads the counters and the observer's records as they move during it."""

    spec: ModelSpec
    client: HostClient
    observer: Recorder


@pytest.fixture(scope="module")
def shared(cross_encoder_dir: Path) -> Iterator[Shared]:
    spec = ModelSpec(path=str(cross_encoder_dir), engine=replace(ONE_AT_A_TIME, max_queued_items=QUEUE_LIMIT))
    observer = Recorder()
    with hosted(spec, observer) as client:
        yield Shared(spec, client, observer)


def test_cross_encoder_outputs_equal_the_forward_in_process(shared: Shared) -> None:
    backend = load_spec(shared.spec)
    assert isinstance(backend, PairScorer)
    inputs = backend.plan_pairs(["what is a capital?"], DOCUMENTS, PairOptions()).encode(no_checkpoint).inputs
    expected = backend.forward(inputs)
    client, observer = shared.client, shared.observer
    assert (client.card.name, client.card.kind, client.card.max_length) == (
        backend.name,
        backend.kind,
        backend.max_length,
    )
    assert client.budget.tokens == 4096
    before, told = client.snapshot().worker.items, len(observer.batches)
    waited = Waited(inputs)
    client.submit(waited.job)
    _close_to(waited.outputs(), expected)
    assert waited.job.started_at is not None and waited.job.started_at >= waited.job.queued_at
    stats = client.snapshot()
    assert stats.worker.items - before == len(inputs)
    assert stats.queued_items == 0
    assert sum(size for size, _, _ in observer.batches[told:]) == len(inputs)  # every batch told to the observer


def test_minilm_embeddings_equal_the_forward_in_process() -> None:
    spec = ModelSpec(engine=EngineConfig(max_batch_tokens=4096, max_batch_size=3))  # the embedded MiniLM
    backend = load_spec(spec)
    assert isinstance(backend, Embedder)
    inputs = backend.plan_embed(DOCUMENTS, EmbedOptions()).encode(no_checkpoint).inputs
    expected = backend.forward(inputs)
    with hosted(spec) as client:
        jobs = [Waited(inputs[:2]), Waited(inputs[2:])]  # two jobs at once, sharing batches
        for waited in jobs:
            client.submit(waited.job)
        _close_to([row for waited in jobs for row in waited.outputs()], expected)


def test_an_llm_reranker_with_a_shared_prefix_scores_as_in_process(tmp_path: Path) -> None:
    """Its prompts share the query's prefix (one object for the request), which the host runs once per batch."""
    folder = build_qwen3_reranker(tmp_path / "qwen3")
    spec = ModelSpec(path=str(folder), kind="llm-reranker", engine=EngineConfig(max_batch_tokens=8192))
    backend = load_spec(spec)
    assert isinstance(backend, PairScorer)
    inputs = backend.plan_pairs(["what is a capital?"], DOCUMENTS, PairOptions()).encode(no_checkpoint).inputs
    assert inputs[0].prefix is not None and all(item.prefix is inputs[0].prefix for item in inputs)
    expected = backend.forward(inputs)
    with hosted(spec) as client:
        waited = Waited(inputs)
        client.submit(waited.job)
        _close_to(waited.outputs(), expected)


def test_an_aborted_queued_job_never_runs(shared: Shared) -> None:
    client, observer = shared.client, shared.observer
    ahead = [Encoded(token_array([101] * 100))] * 300  # 300 one-item batches to wait behind
    before, drops = client.snapshot().worker, len(observer.drops)
    first, behind = Waited(ahead), Waited([Encoded(token_array([102] * 8))] * 4)
    client.submit(first.job)
    client.submit(behind.job)
    client.cancel(behind.job)
    assert len(first.outputs()) == len(ahead)
    stats = client.snapshot()
    assert not behind.finished.is_set()
    assert behind.job.started_at is None
    assert stats.worker.items - before.items == len(ahead)  # none of the aborted job's items ran
    assert stats.worker.items_of_cancelled_jobs - before.items_of_cancelled_jobs == 0
    assert observer.drops[drops:] == [4]


def test_the_client_refuses_past_max_queued_items(shared: Shared) -> None:
    """Its own books decide, so the host is paused (and resumed: the next test shares it): nothing it does can
    change the count."""
    client = shared.client
    item = Encoded(token_array([101] * 5))
    assert client.pid is not None
    os.kill(client.pid, signal.SIGSTOP)
    try:
        full = Waited([item] * QUEUE_LIMIT)
        client.submit(full.job)  # exactly the limit
        with pytest.raises(QueueFull, match=f"{QUEUE_LIMIT} items are queued; the limit is {QUEUE_LIMIT}"):
            client.submit(Waited([item]).job)
        client.cancel(full.job)  # its items leave the books at once
        again = Waited([item] * QUEUE_LIMIT)
        client.submit(again.job)
    finally:
        os.kill(client.pid, signal.SIGCONT)
    assert len(again.outputs()) == QUEUE_LIMIT


def test_a_killed_host_fails_every_outstanding_job_at_once(cross_encoder_dir: Path) -> None:
    spec = ModelSpec(path=str(cross_encoder_dir), engine=ONE_AT_A_TIME)
    item = Encoded(token_array([101] * 100))
    with hosted(spec) as client:
        assert client.pid is not None and client.health.ready
        os.kill(client.pid, signal.SIGSTOP)  # nothing it holds can be answered before it dies
        jobs = [Waited([item] * 50), Waited([item] * 3)]
        for waited in jobs:
            client.submit(waited.job)
        killed = time.monotonic()
        os.kill(client.pid, signal.SIGKILL)
        for waited in jobs:
            assert waited.finished.wait(5)
            assert isinstance(waited.job.error, WorkerDied)
        failed_after = time.monotonic() - killed
        health = client.health
        assert not health.ready
        assert isinstance(health.death, WorkerDied)
        assert "exited with status -9" in str(health.death)
        with pytest.raises(QueueFull):
            client.submit(Waited([item]).job)
    # At once: on the socket's end, plus at most half a second to learn the exit status. The bound is wide
    # (a loaded machine); a death noticed only at some later timeout, or never, fails the waits above.
    assert failed_after < 4.0


def test_a_host_whose_model_fails_to_load_gives_its_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    client = HostClient(ModelSpec(path=str(tmp_path)), observer=Recorder(), start_timeout=START)
    with pytest.raises(HostStartError) as caught:
        client.start()
    message = str(caught.value)
    assert "\n" not in message
    assert "(the model host exited with status 1)" in message
    assert client.exit_status == 1
    assert not client.health.ready


def test_a_host_not_ready_in_time_is_killed(cross_encoder_dir: Path) -> None:
    client = HostClient(ModelSpec(path=str(cross_encoder_dir)), observer=Recorder(), start_timeout=0.2)
    with pytest.raises(HostStartError, match=r"not ready within 0\.2 s"):
        client.start()
    assert client.exit_status == -signal.SIGKILL


def _spawn_host(spec: ModelSpec) -> tuple[subprocess.Popen[bytes], Channel]:
    """A host started as a client starts one, its end of the socket held here."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        [sys.executable, "-m", "scorekit.host", "--fd", str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    ours.settimeout(START)  # a read that waits longer ends the stream (receive answers None)
    channel = Channel(ours, name="test-front-end")
    channel.send(wire.Hello(spec, 1))
    return process, channel


def test_the_host_exits_when_its_front_end_goes_away(cross_encoder_dir: Path) -> None:
    process, channel = _spawn_host(ModelSpec(path=str(cross_encoder_dir), engine=ONE_AT_A_TIME))
    try:
        assert isinstance(channel.receive(), wire.Ready)
        channel.close(timeout=1)  # as the socket closes when the front end's process dies
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_finishes_what_is_queued_then_exits(cross_encoder_dir: Path) -> None:
    process, channel = _spawn_host(ModelSpec(path=str(cross_encoder_dir), engine=ONE_AT_A_TIME))
    try:
        assert isinstance(channel.receive(), wire.Ready)
        inputs = [Encoded(token_array([101] * 20))] * 40
        channel.send(wire.submit(1, inputs))
        message = channel.receive()
        while message is not None and not isinstance(message, wire.Started):
            message = channel.receive()
        assert isinstance(message, wire.Started)  # queued: its first item runs, 39 wait
        process.send_signal(signal.SIGTERM)
        answers = list(channel)
        assert process.wait(WAIT) == 0
    finally:
        channel.close(timeout=1)
        if process.poll() is None:
            process.kill()
            process.wait()
    done = [message for message in answers if isinstance(message, wire.Done)]
    assert len(done) == 1 and done[0].job == 1
    assert wire.from_wire(done[0].outputs[0]).shape[0] == len(inputs)
