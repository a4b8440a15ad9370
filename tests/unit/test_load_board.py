"""The load board (``scorekit.load.Board``): the counters every front-end process of one server shares, and what
reads them: ``LoadCounter`` (the load over every front end, and this process's own share), the engine's admission
limit (the whole server's) and the drain (which waits for its own process's requests only).

A second front end is a real process (``python -c``) that attaches the same file; rows of one process are two
``Board`` objects, each with its own file descriptor, as two processes have.
"""

from __future__ import annotations

import random
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import anyio
import anyio.to_thread
import pytest
import uvicorn

from scorekit.api.errors import as_http_error
from scorekit.engine import Engine
from scorekit.errors import Overloaded
from scorekit.load import COLUMNS, NAME_BYTES, ROWS, Board, LoadCounter
from scorekit.middleware.drain import Drain
from scorekit.serving import _DrainingServer
from scorekit.settings import EngineConfig
from tests.unit.test_batching import Silent
from tests.unit.test_engine_rules import HELD, WAIT, Backend, plan

ROOT = Path(__file__).resolve().parents[2]  # the tree these tests import scorekit from: the other process too
REFUSED_WITHIN = 5.0  # seconds; a refusal is raised before the request's first await

# A second front end: attaches row ``argv[2]`` of the board at ``argv[1]`` and, for each name on its stdin's
# first line, enters that route; says "counted", then waits for a line before it leaves them all and exits.
FRONT_END = """
import sys
from pathlib import Path
from scorekit.load import Board, LoadCounter
board = Board.attach(Path(sys.argv[1]), int(sys.argv[2]))
load = LoadCounter(board)
routes = sys.stdin.readline().split()
for route in routes:
    load.enter(); load.enter_route(route)
print("counted", flush=True)
sys.stdin.readline()
for route in routes:
    load.exit_route(route); load.exit()
board.close()
"""

# A front end that claims ``names`` (its stdin's first line, in that order) once every process is ready (its
# second line), and counts 1 in each.
CLAIMER = """
import sys
from pathlib import Path
from scorekit.load import Board
board = Board.attach(Path(sys.argv[1]), int(sys.argv[2]))
names = sys.stdin.readline().split()
sys.stdin.readline()
for name in names:
    board.cell(name).add(1)
board.close()
"""


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    """A new board's file; its creator (the supervisor's view: no row) is closed after the test."""
    where = tmp_path / "load.board"
    creator = Board.create(where)
    yield where
    creator.close()


def front_end(board: Path, row: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FRONT_END, str(board), str(row)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_two_rows_count_one_load_each_knowing_its_own(path: Path) -> None:
    """Two front ends' counters: ``total``, ``routed`` and ``per_route`` are over both; ``routed_here`` is each
    one's own, and what one gives back leaves the other's standing."""
    one, two = Board.attach(path, 0), Board.attach(path, 1)
    try:
        first, second = LoadCounter(one), LoadCounter(two)
        first.enter()
        first.enter_route("/score")
        second.enter()
        second.enter_route("/score")
        second.enter()
        second.enter_route("/rerank")
        second.enter()  # /load: in flight, not load
        for load in (first, second):
            assert (load.total, load.routed, load.per_route()) == (4, 3, {"/score": 2, "/rerank": 1})
        assert (first.routed_here, second.routed_here) == (1, 2)
        second.exit_route("/score")
        second.exit()
        assert (first.routed, first.per_route(), first.routed_here, second.routed_here) == (
            2,
            {"/score": 1, "/rerank": 1},
            1,
            1,
        )
    finally:
        one.close()
        two.close()


def test_a_second_process_counts_on_the_same_board(path: Path) -> None:
    """A front end in another process names a route this one never named, and enters it twice: this one sees the
    load while it runs (none of it its own), and none once that process has given it back."""
    here = Board.attach(path, 0)
    process = front_end(path, 3)
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("/rerank /rerank\n")
        process.stdin.flush()
        assert process.stdout.readline() == "counted\n"
        load = LoadCounter(here)
        assert (load.total, load.routed, load.per_route(), load.routed_here) == (2, 2, {"/rerank": 2}, 0)
        process.stdin.write("\n")
        process.stdin.close()
        assert process.wait(WAIT) == 0
        assert (load.total, load.routed, load.per_route()) == (0, 0, {})
    finally:
        process.kill()
        process.wait(WAIT)
        here.close()


def test_a_column_is_claimed_once_whoever_names_it_first(path: Path) -> None:
    """Four processes name the same 40 counters at once, each in its own order, and count 1 in each: every name
    has one column, so each reads 4 here, and a name this process knew first (it claims the first) is the same."""
    names = [f"n{i}" for i in range(40)]
    here = Board.attach(path, 0)
    here.cell(names[0]).add(1)
    claimers = []
    try:
        for row in range(1, 5):
            order = random.Random(row).sample(names, len(names))
            claimer = subprocess.Popen(
                [sys.executable, "-c", CLAIMER, str(path), str(row)], cwd=ROOT, stdin=subprocess.PIPE, text=True
            )
            assert claimer.stdin is not None
            claimer.stdin.write(" ".join(order) + "\n")
            claimer.stdin.flush()
            claimers.append(claimer)
        for claimer in claimers:  # go, all at once: each is blocked on its second line
            assert claimer.stdin is not None
            claimer.stdin.close()
        assert [claimer.wait(WAIT) for claimer in claimers] == [0] * 4
        assert here.totals("n") == {name[1:]: 4 + (name == names[0]) for name in names}
        assert here.cell(names[0]).value == 5 and here.cell(names[0]).here == 1
    finally:
        for claimer in claimers:
            claimer.kill()
            claimer.wait(WAIT)
        here.close()


def test_clear_zeroes_one_front_ends_row_only(path: Path) -> None:
    """The supervisor clears a dead front end's row: its counts are gone, the other's stand; a row outside the
    board is refused, never read as a row from its end."""
    creator, one, last = Board(path, None), Board.attach(path, 0), Board.attach(path, ROWS - 1)
    try:
        one.cell("load").add(2)
        last.cell("load").add(3)
        creator.clear(0)
        assert creator.totals("") == {"load": 3}
        for outside in (-1, ROWS):
            with pytest.raises(ValueError, match="rows 0 to"):
                creator.clear(outside)
        assert last.cell("load").value == 3
        with pytest.raises(RuntimeError, match="no row"):
            creator.cell("load")  # the creator reads and clears; it never counts
    finally:
        for board in (creator, one, last):
            board.close()


def test_counter_names_take_1_to_NAME_BYTES_less_one_bytes(path: Path) -> None:
    """A name as long as it may be (in bytes, not characters) is claimed and found again by another front end;
    one byte more, an empty name, or a NUL (which pads the names' table) is refused."""
    one, two = Board.attach(path, 0), Board.attach(path, 1)
    try:
        longest = "é" * ((NAME_BYTES - 1) // 2) + "x" * ((NAME_BYTES - 1) % 2)
        assert len(longest.encode()) == NAME_BYTES - 1
        one.cell(longest).add(1)
        two.cell(longest).add(1)
        assert one.totals("é") == {longest[1:]: 2}
        for refused in ("", longest + "x", "é" * (NAME_BYTES // 2), "a\0"):
            with pytest.raises(ValueError, match="bytes"):
                one.cell(refused)
    finally:
        one.close()
        two.close()


def test_a_board_names_COLUMNS_counters_and_refuses_one_more(path: Path) -> None:
    board = Board.attach(path, 0)
    try:
        for column in range(COLUMNS):
            board.cell(f"c{column}")
        with pytest.raises(ValueError, match="all named"):
            board.cell("one more")
        board.cell("c0").add(1)  # a name claimed already is found
        assert board.totals("c") == {"0": 1}
    finally:
        board.close()


def test_attach_takes_rows_0_to_ROWS_less_one(path: Path) -> None:
    for row in (0, ROWS - 1):
        Board.attach(path, row).close()
    for row in (-1, ROWS):
        with pytest.raises(ValueError, match=f"rows 0 to {ROWS - 1}, not {row}"):
            Board.attach(path, row)


def test_the_admission_limit_is_the_whole_servers(path: Path) -> None:
    """Two front ends' engines for one model count their admitted requests in one column: with a limit of two,
    one request held in each fills it, and one more on either is refused (Overloaded, a 503). Both report the
    server's two as the model's load; each one's snapshot counts its own. Once both finish, the limit is free."""
    one, two = Board.attach(path, 0), Board.attach(path, 1)
    backends = (Backend(), Backend())
    config = EngineConfig(
        max_batch_tokens=10_000, max_batch_size=1, batch_efficiency=None, small_job_lane=0, max_concurrent_requests=2
    )
    engines = [
        Engine(backend, config, observer=Silent(), admitted=board.cell("admitted:m"))  # type: ignore[arg-type]
        for backend, board in zip(backends, (one, two), strict=True)
    ]
    for engine in engines:
        engine.start()
    try:

        async def main() -> None:
            async with anyio.create_task_group() as group:
                for engine, backend in zip(engines, backends, strict=True):
                    group.start_soon(engine.execute, plan(HELD))
                    assert await anyio.to_thread.run_sync(backend.entered.wait, WAIT)
                assert [engine.active_requests for engine in engines] == [2, 2]
                assert [engine.snapshot().active_requests for engine in engines] == [1, 1]
                for engine in engines:
                    # A refusal comes before any wait; one admitted by mistake would queue behind the held batch.
                    with pytest.raises(Overloaded) as refused, anyio.fail_after(REFUSED_WITHIN):
                        await engine.execute(plan(4))
                    answer = as_http_error(refused.value, "Score")
                    assert answer is not None and answer.status == 503
                for backend in backends:
                    backend.gate.set()
            assert [engine.active_requests for engine in engines] == [0, 0]
            with anyio.fail_after(WAIT):
                assert await engines[1].execute(plan(4, 2)) == [4.0, 2.0]

        anyio.run(main)
    finally:
        for engine, backend in zip(engines, backends, strict=True):
            backend.gate.set()
            engine.stop(WAIT)
        one.close()
        two.close()


class FrontEnd:
    """What a draining server reads of its ``ScorekitApp``: its load, its drain, its settings and its hosts."""

    def __init__(self, load: LoadCounter) -> None:
        self.load = load
        self.drain = Drain()
        self.settings = SimpleNamespace(shutdown_timeout=WAIT)

    def dead_host(self) -> None:
        return None


def test_a_drain_waits_for_its_own_requests_not_another_front_ends(path: Path) -> None:
    """At a SIGTERM a front end waits for the requests it serves; another front end's still in flight are that
    one's to finish, so with none of its own it stops waiting at its next tick, and with one it waits."""
    one, two = Board.attach(path, 0), Board.attach(path, 1)
    try:
        mine, theirs = LoadCounter(one), LoadCounter(two)
        theirs.enter()
        theirs.enter_route("/score")
        server = _DrainingServer(uvicorn.Config(app=None), FrontEnd(mine), None)  # type: ignore[arg-type]
        server.handle_exit(signal.SIGTERM, None)
        assert mine.routed == 1 and anyio.run(server.on_tick, 1) is True
        mine.enter()
        mine.enter_route("/rerank")
        assert anyio.run(server.on_tick, 2) is False
    finally:
        one.close()
        two.close()


def test_the_shared_row_is_every_front_ends_and_no_counters(path: Path) -> None:
    """A shared word (a quota bucket's) is one value every front end reads and writes, even the last row's and the
    creator's; no column's total counts it, and clearing a front end's row leaves it."""
    creator, one, last = Board(path, None), Board.attach(path, 0), Board.attach(path, ROWS - 1)
    try:
        one.cell("quota:requests:0").add(2)  # a counter of the same name, in a front end's row
        with last.locked():
            last.shared("quota:requests:0").value = 7_000_000_000
        assert one.shared("quota:requests:0").value == creator.shared("quota:requests:0").value == 7_000_000_000
        assert creator.totals("quota:") == {"requests:0": 2}
        creator.clear(ROWS - 1)
        creator.clear(0)
        assert one.shared("quota:requests:0").value == 7_000_000_000 and creator.totals("quota:") == {}
    finally:
        for board in (creator, one, last):
            board.close()


def test_the_boards_lock_is_held_by_one_process_at_a_time(path: Path) -> None:
    """While this process holds the lock, another front end's ``locked`` waits for it (a real process): it reads
    nothing until the lock is let go, and then what was written under it."""
    board = Board.attach(path, 0)
    waiter = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout is not None
        with board.locked():
            assert waiter.stdout.readline() == "waiting\n"
            ready, _, _ = select.select([waiter.stdout], [], [], HELD_FOR)
            assert not ready, "the other process read the shared word while this one held the lock"
            board.shared("word").value = 1
        assert waiter.stdout.readline() == "read 1\n"
        assert waiter.wait(30) == 0
    finally:
        waiter.kill()
        board.close()


def test_the_boards_lock_is_held_by_one_thread_at_a_time_and_re_entered(path: Path) -> None:
    """A flock is the open file's, shared by the process's threads: a second thread still waits for the first, and
    the lock re-entered (a counter named under it) is let go only by the outermost block."""
    board = Board.attach(path, 0)
    holding, release, entered = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with board.locked():
            with board.locked():
                board.cell("named under the lock")
            holding.set()  # still held here, after the inner block
            assert release.wait(30)

    def second() -> None:
        assert holding.wait(30)
        with board.locked():
            entered.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    try:
        for thread in threads:
            thread.start()
        assert holding.wait(30)
        assert not entered.wait(HELD_FOR), "a second thread took the lock while the first held it"
        release.set()
        assert entered.wait(30)
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
        board.close()


HELD_FOR = 0.5  # seconds the test holds the lock while the other process waits for it
# Attaches the board at argv[1], says "waiting" and takes its lock (held by the test); once it has it, reads the
# shared word: the test's write, made before it let go, must be there.
LOCKER = """
import sys
from pathlib import Path
from scorekit.load import Board
board = Board.attach(Path(sys.argv[1]), 1)
print("waiting", flush=True)
with board.locked():
    print("read", board.shared("word").value, flush=True)
"""
