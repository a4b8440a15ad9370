"""A model host that serves several front ends (``--api-processes``): its owner starts it with a listener, front
ends join it there, and each gets the owner's card, its own answers, a share of batches it fills with the others,
and (the oldest of them) the reports. A front end that leaves costs the others nothing; the owner's leaving ends
the host. Real host processes and sockets; every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from scorekit.batching import QueueFull
from scorekit.errors import WorkerDied
from scorekit.host import wire
from scorekit.host.channel import Channel
from scorekit.host.client import HostClient, HostStartError
from scorekit.load import Board, Cell
from scorekit.models import load_spec
from scorekit.models.base import Encoded, PairScorer, no_checkpoint, token_array
from scorekit.settings import EngineConfig, ModelSpec
from scorekit.tasks import PairOptions
from tests.host.conftest import DOCUMENTS, WAIT, Recorder, Waited, hosted

# The shared host's queue limit, over every front end.
QUEUE_LIMIT = 400
# Batches of 8 items at most, cut by size alone (no efficiency cut, no small-job lane): a job of 200 items
# takes 25 batches, and every batch cut while two jobs wait holds items of both (one of each first).
CONFIG = EngineConfig(
    max_batch_tokens=4096, max_batch_size=8, small_job_lane=0, batch_efficiency=None, max_queued_items=QUEUE_LIMIT
)
ITEM = Encoded(token_array([101] * 5))


@dataclass
class Shared:
    """One host, owned by ``owner`` with a listener at ``address``, for the tests that do not end it. Each test
    joins its own front ends and closes them before it ends, so the next test's first is the oldest."""

    spec: ModelSpec
    owner: HostClient
    observer: Recorder
    address: str

    @property
    def pid(self) -> int:
        assert self.owner.pid is not None
        return self.owner.pid


def _listener(folder: Path) -> tuple[socket.socket, str]:
    address = str(folder / "host.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    return listener, address


@pytest.fixture(scope="module")
def shared(cross_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    spec = ModelSpec(path=str(cross_encoder_dir), engine=CONFIG)
    listener, address = _listener(tmp_path_factory.mktemp("joined"))
    observer = Recorder()
    with hosted(spec, observer, listener=listener) as owner:
        yield Shared(spec, owner, observer, address)


@contextmanager
def joined(
    shared: Shared, observer: Recorder | None = None, cells: tuple[Cell, Cell] | None = None
) -> Iterator[HostClient]:
    """A front end joined to the shared host; it leaves after."""
    client = HostClient(
        shared.spec,
        observer=observer or Recorder(),
        start_timeout=WAIT,
        stats_timeout=WAIT,
        address=shared.address,
        cells=cells,
    )
    client.start()
    try:
        yield client
    finally:
        client.stop(timeout=WAIT)


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """The host stopped (SIGSTOP): what the front ends send waits in its sockets until it goes on."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _close_to(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert row.shape == want.shape and row.dtype == want.dtype
        assert torch.allclose(row, want, atol=1e-5, rtol=0)


def _items(recorder: Recorder) -> int:
    return sum(size for size, _, _ in recorder.batches)


def test_joined_front_ends_get_the_owners_card_and_budget(shared: Shared) -> None:
    with joined(shared) as first, joined(shared) as second:
        for client in (first, second):
            assert client.card == shared.owner.card
            assert client.budget == shared.owner.budget
            assert client.health.ready
            assert client.pid is None and client.exit_status is None


def test_two_front_ends_are_answered_each_its_own_in_batches_they_share(shared: Shared) -> None:
    backend = load_spec(shared.spec)
    assert isinstance(backend, PairScorer)
    first = backend.plan_pairs(["what is a capital?"], DOCUMENTS, PairOptions()).encode(no_checkpoint).inputs
    second = backend.plan_pairs(["which cell makes energy?"], DOCUMENTS[::-1], PairOptions())
    second_inputs = second.encode(no_checkpoint).inputs
    before = len(shared.owner.snapshot().worker.recent_batch_jobs)
    with joined(shared) as one, joined(shared) as other:
        # 25 batches each: whichever the host reads first, the other is queued while most of its batches wait.
        ones, others = Waited(first * 40), Waited(second_inputs * 40)
        with paused(shared.pid):  # both jobs wait in the host's sockets, so neither is done before the other comes
            one.submit(ones.job)
            other.submit(others.job)
        _close_to(ones.outputs(), backend.forward(first) * 40)
        _close_to(others.outputs(), backend.forward(second_inputs) * 40)
    jobs = list(shared.owner.snapshot().worker.recent_batch_jobs)[before:]
    assert sum(1 for count in jobs if count == 2) >= 1, jobs  # a batch held items of both front ends


def test_a_front_end_that_leaves_has_its_queued_items_dropped_and_the_others_go_on(shared: Shared) -> None:
    """The one that leaves is a bare connection that closes (as a front end's process dies): its job and its
    close reach the host together, behind a job of 25 batches, so its items are still queued when it leaves. It
    joined first, so it is told the reports until it leaves, and its own drop is told to the one that stays."""
    stays = Recorder()
    before, owner_drops = shared.owner.snapshot().worker.items, len(shared.observer.drops)
    _, leaving = _bare_join(shared, "test-leaving-front-end")
    try:
        with joined(shared, stays) as staying:
            blocker = Waited([ITEM] * 200)
            with paused(shared.pid):
                staying.submit(blocker.job)
                leaving.send(wire.submit(0, [ITEM] * 50))
                leaving.close_write(timeout=WAIT)  # written before the host goes on
            answers = list(leaving)  # the host closes the connection once it has cancelled the job
            assert not [message for message in answers if isinstance(message, (wire.Done, wire.Failed, wire.Dropped))]
            assert len(blocker.outputs()) == 200
            ran = shared.owner.snapshot().worker.items - before
            dropped = 250 - ran
            assert dropped > 0
            _eventually(lambda: bool(stays.drops), "the drop was never reported")
            assert stays.drops == [dropped]  # told once, to the front end that stays
            after = Waited([ITEM] * 3)
            staying.submit(after.job)
            assert len(after.outputs()) == 3
            assert staying.health.ready and shared.owner.health.ready
    finally:
        leaving.close(timeout=1)
    assert shared.observer.drops[owner_drops:] == []


def _bare_join(shared: Shared, name: str) -> tuple[socket.socket, Channel]:
    """A connection that joins the shared host as a front end would, with no client around it: its socket (a read
    that waits longer than WAIT ends the stream) and its channel, past the host's Ready."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT)
    sock.connect(shared.address)
    channel = Channel(sock, name=name)
    channel.send(wire.Join())
    assert isinstance(channel.receive(), wire.Ready)
    return sock, channel


def test_reports_go_to_the_oldest_front_end_and_move_on_when_it_leaves(shared: Shared) -> None:
    told_older, told_younger = Recorder(), Recorder()
    owner_batches = len(shared.observer.batches)
    with joined(shared, told_older) as older, joined(shared, told_younger) as younger:
        job = Waited([ITEM] * 10)
        younger.submit(job.job)
        assert len(job.outputs()) == 10
        _eventually(lambda: _items(told_older) == 10, "the oldest front end was not told the batches")
        assert told_younger.batches == []
        older.stop(timeout=WAIT)  # its connection is closed, and the host knows it, when stop returns
        assert not older.health.ready
        job = Waited([ITEM] * 6)
        younger.submit(job.job)
        assert len(job.outputs()) == 6
        _eventually(lambda: _items(told_younger) == 6, "the reports did not move to the next front end")
        assert _items(told_older) == 10
    assert shared.observer.batches[owner_batches:] == []  # the owner of a listener is told nothing


def test_a_front_end_that_cannot_be_written_to_is_closed_alone(shared: Shared) -> None:
    """A joined front end that reads no more (its socket's reading side shut, so a write to it fails) joined
    first: the first report it is sent fails, which closes its connection alone; the reports move on to the next
    front end, and the host goes on."""
    told = Recorder()
    sock, deaf = _bare_join(shared, "test-deaf-front-end")
    try:
        with joined(shared, told) as hearing:
            sock.shutdown(socket.SHUT_RD)

            def told_after_a_job() -> bool:
                job = Waited([ITEM] * 2)
                hearing.submit(job.job)
                assert len(job.outputs()) == 2
                return bool(told.batches)

            _eventually(told_after_a_job, "the reports never moved on from a front end that cannot be written to")
            assert hearing.health.ready and shared.owner.health.ready
    finally:
        deaf.close(timeout=1)


def test_the_queue_books_on_a_board_count_every_front_end(shared: Shared, tmp_path: Path) -> None:
    path = tmp_path / "board"
    creator = Board.create(path)
    rows = [Board.attach(path, 0), Board.attach(path, 1)]
    cells = [(row.cell("queued_items"), row.cell("queued_tokens")) for row in rows]
    try:
        with joined(shared, cells=cells[0]) as one, joined(shared, cells=cells[1]) as other:
            mine, theirs = Waited([ITEM] * (QUEUE_LIMIT - 3)), Waited([ITEM] * 3)
            with paused(shared.pid):  # nothing is answered, so nothing leaves the books
                one.submit(mine.job)
                other.submit(theirs.job)  # exactly the limit, over both
                total = (QUEUE_LIMIT, QUEUE_LIMIT * ITEM.cost)
                assert one.queue() == other.queue() == total
                assert (cells[0][0].here, cells[1][0].here) == (QUEUE_LIMIT - 3, 3)
                for client in (one, other):
                    with pytest.raises(QueueFull, match=f"{QUEUE_LIMIT} items are queued; the limit is {QUEUE_LIMIT}"):
                        client.submit(Waited([ITEM]).job)
            assert len(mine.outputs()) == QUEUE_LIMIT - 3
            assert len(theirs.outputs()) == 3
            assert one.queue() == other.queue() == (0, 0)
    finally:
        for board in (*rows, creator):
            board.close()


def test_joining_where_no_host_answers_is_a_start_error(shared: Shared, tmp_path: Path) -> None:
    nowhere = HostClient(shared.spec, observer=Recorder(), address=str(tmp_path / "none.sock"))
    with pytest.raises(HostStartError, match=r"no model host listens at .*none\.sock"):
        nowhere.start()
    listener, address = _listener(tmp_path)  # listens, but never accepts
    try:
        silent = HostClient(shared.spec, observer=Recorder(), address=address, start_timeout=0.2)
        with pytest.raises(HostStartError, match=r"did not answer within 0\.2 s"):
            silent.start()
        assert not silent.health.ready
    finally:
        listener.close()


def _own_host(folder: Path, tmp_path: Path) -> tuple[ModelSpec, socket.socket, str, HostClient]:
    """For a test that ends its host: the spec, the listener to hand the owner, its address, and a front end
    (not started) that joins there."""
    spec = ModelSpec(path=str(folder), engine=CONFIG)
    listener, address = _listener(tmp_path)
    front_end = HostClient(spec, observer=Recorder(), start_timeout=WAIT, stats_timeout=WAIT, address=address)
    return spec, listener, address, front_end


def test_the_owners_leaving_ends_the_host_after_what_is_queued(cross_encoder_dir: Path, tmp_path: Path) -> None:
    spec, listener, address, front_end = _own_host(cross_encoder_dir, tmp_path)
    try:
        with hosted(spec, listener=listener) as owner:
            front_end.start()
            queued = Waited([ITEM] * 200)
            front_end.submit(queued.job)
            _eventually(lambda: queued.job.started_at is not None, "the job never started")
            stopping = threading.Thread(target=owner.stop, args=(WAIT,))
            stopping.start()
            assert len(queued.outputs()) == 200  # what the front end had queued is finished first
            stopping.join(WAIT)
        assert owner.exit_status == 0
        _eventually(lambda: not front_end.health.ready, "the front end never saw its host go")
        assert isinstance(front_end.health.death, WorkerDied)
        assert "lost its connection" in str(front_end.health.death)
        with pytest.raises(QueueFull):
            front_end.submit(Waited([ITEM]).job)
    finally:
        front_end.stop(timeout=WAIT)
    late = HostClient(spec, observer=Recorder(), start_timeout=WAIT, address=address)
    with pytest.raises(HostStartError, match="no model host listens at"):  # refused at once: nobody listens
        late.start()


def test_a_killed_host_is_a_death_to_its_front_ends_and_refuses_joins(cross_encoder_dir: Path, tmp_path: Path) -> None:
    """The host's copy of the listener was the only one: once the host is gone, a front end that (re)joins is
    refused at once, not left waiting for an answer."""
    spec, listener, address, front_end = _own_host(cross_encoder_dir, tmp_path)
    try:
        with hosted(spec, listener=listener) as owner:
            front_end.start()
            assert owner.pid is not None
            os.kill(owner.pid, signal.SIGKILL)  # no shutdown of the listener: only its closing refuses
            _eventually(lambda: not front_end.health.ready, "the front end never saw its host die")
            assert "The model host process lost its connection." in str(front_end.health.death)
            _eventually(lambda: not owner.health.ready, "the owner never saw its host die")
            late = HostClient(spec, observer=Recorder(), start_timeout=WAIT, address=address)
            with pytest.raises(HostStartError, match="no model host listens at"):
                late.start()
    finally:
        front_end.stop(timeout=WAIT)
