"""The bytes of request bodies being decoded at once never exceed the server's bound (``DecodeBudget``).

The rule is checked where it is kept (the budget, with tasks that hold their bytes across checkpoints) and where
it matters (``common.decode``, with real worker threads that record how many bytes are inside msgspec at once).
A body over the bound still decodes, alone; waiters are let in in arrival order; a waiter that is cancelled
gives its place up.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import anyio
import anyio.lowlevel
import msgspec
import pytest

from scorekit.api import common
from scorekit.api.decoding import DecodeBudget
from scorekit.http import Request
from scorekit.schemas import RerankRequest

LIMIT = 100
WAIT = 10  # seconds: far more than any of these needs; a budget that never lets a waiter in fails here


class Holders:
    """Tasks that hold ``size`` bytes of a budget across a few checkpoints, and what was held at once."""

    def __init__(self, budget: DecodeBudget) -> None:
        self.budget = budget
        self.inside: dict[str, int] = {}
        self.peak = 0
        self.overlaps: list[set[str]] = []
        self.order: list[str] = []

    async def hold(self, name: str, size: int, checkpoints: int = 5) -> None:
        async with self.budget.hold(size):
            self.order.append(name)
            self.inside[name] = size
            self.peak = max(self.peak, sum(self.inside.values()))
            self.overlaps.append(set(self.inside))
            for _ in range(checkpoints):
                await anyio.lowlevel.checkpoint()
            del self.inside[name]


def test_the_bytes_held_at_once_never_exceed_the_bound() -> None:
    sizes = [60, 30, 50, 20, 70, 10, 40, 90, 5, 35, 65, 25]

    async def main() -> Holders:
        holders = Holders(DecodeBudget(LIMIT))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                for i, size in enumerate(sizes):
                    tasks.start_soon(holders.hold, f"b{i}", size)
        assert holders.budget.held == 0
        return holders

    holders = anyio.run(main)
    assert sorted(holders.order) == sorted(f"b{i}" for i in range(len(sizes)))
    assert holders.peak <= LIMIT
    assert max(len(overlap) for overlap in holders.overlaps) >= 2  # it lets several in at once, not one at a time


def test_a_body_over_the_bound_decodes_alone() -> None:
    async def main() -> Holders:
        holders = Holders(DecodeBudget(LIMIT))
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                for name, size in (("small", 30), ("huge", 250), ("after", 30)):
                    tasks.start_soon(holders.hold, name, size)
                    await anyio.lowlevel.checkpoint()
        return holders

    holders = anyio.run(main)
    assert "huge" in holders.order
    assert all(overlap == {"huge"} for overlap in holders.overlaps if "huge" in overlap)


def test_waiters_are_let_in_in_arrival_order() -> None:
    """A small body that would fit does not pass a large one waiting for room ahead of it."""

    async def main() -> list[str]:
        budget = DecodeBudget(LIMIT)
        order: list[str] = []
        release = anyio.Event()

        async def take(name: str, size: int, until: anyio.Event | None = None) -> None:
            async with budget.hold(size):
                order.append(name)
                if until is not None:
                    await until.wait()

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(take, "first", 60, release)
                await anyio.wait_all_tasks_blocked()
                tasks.start_soon(take, "large", 80)
                await anyio.wait_all_tasks_blocked()
                tasks.start_soon(take, "small", 10)  # 60 + 10 fits, but "large" came first
                await anyio.wait_all_tasks_blocked()
                assert order == ["first"]
                release.set()
        return order

    assert anyio.run(main) == ["first", "large", "small"]


def test_a_cancelled_waiter_gives_its_place_up() -> None:
    async def main() -> None:
        budget = DecodeBudget(LIMIT)
        admitted: list[str] = []
        release = anyio.Event()

        async def take(name: str, size: int) -> None:
            async with budget.hold(size):
                admitted.append(name)
                await release.wait()

        waiting = anyio.CancelScope()

        async def leaves() -> None:
            with waiting:
                await take("leaves", 50)  # first in line, then its client goes

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(take, "first", 90)
                await anyio.wait_all_tasks_blocked()
                tasks.start_soon(leaves)
                await anyio.wait_all_tasks_blocked()
                tasks.start_soon(take, "behind", 10)  # 90 + 10 fits, but it waits behind "leaves"
                await anyio.wait_all_tasks_blocked()
                assert admitted == ["first"]
                waiting.cancel()
                await anyio.wait_all_tasks_blocked()
                assert admitted == ["first", "behind"]
                assert budget.held == LIMIT
                release.set()
        assert budget.held == 0

    anyio.run(main)


def test_decode_keeps_the_bytes_inside_msgspec_under_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight bodies over the inline size decode in threads, at most the bound's worth of them at once."""
    body = b'{"query": "q", "documents": [' + b",".join([b'"word"'] * 60_000) + b"]}"  # ~420 KB each
    assert len(body) > common.INLINE_DECODE_BYTES
    bound = 2 * len(body) + len(body) // 2  # room for two at once, not three
    lock = threading.Lock()
    inside = [0]
    peak = [0]
    real = common._decoder

    def recording(kind: type[msgspec.Struct]) -> msgspec.json.Decoder[msgspec.Struct]:
        decoder = real(kind)

        class Recorder:
            def decode(self, data: bytes) -> msgspec.Struct:
                with lock:
                    inside[0] += len(data)
                    peak[0] = max(peak[0], inside[0])
                try:
                    time.sleep(0.05)  # so that decodes the budget lets in at once overlap in time
                    decoded: msgspec.Struct = decoder.decode(data)
                    return decoded
                finally:
                    with lock:
                        inside[0] -= len(data)

        return Recorder()  # type: ignore[return-value]

    monkeypatch.setattr(common, "_decoder", recording)
    state = SimpleNamespace(decoding=DecodeBudget(bound))

    async def main() -> None:
        async def one() -> None:
            request = Request("POST", "/rerank", {"content-type": "application/json"}, body, state)
            decoded = await common.decode(request, RerankRequest)
            assert len(decoded.documents) == 60_000

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                for _ in range(8):
                    tasks.start_soon(one)

    anyio.run(main)
    assert len(body) < peak[0] <= bound  # two decoded side by side, never three
    assert state.decoding.held == 0
