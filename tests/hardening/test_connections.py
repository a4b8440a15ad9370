"""Connection floods against a real `scorekit serve` process with a small open-file limit, so a few dozen
loopback sockets do what thousands would in production: idle connections past the descriptors, slowloris
request heads, and connections that connect and reset. A good client must still get its answer.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from tests.hardening.conftest import reset
from tests.hardening.process import log_lines, scorekit_serve
from tests.live import Live

GOOD = {"query": "q", "documents": ["a", "b"]}


@contextlib.contextmanager
def _sockets(live: Live, n: int) -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        for _ in range(n):
            opened.append(live.connect(timeout=30))
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _closed_by_server(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1024) == b""
    except ConnectionError:
        return True


def _count_closed(sockets: list[socket.socket], at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    closed: set[int] = set()
    while len(closed) < at_least and time.monotonic() < deadline:
        closed |= {i for i, sock in enumerate(sockets) if i not in closed and _closed_by_server(sock)}
        time.sleep(0.05)
    return len(closed)


def test_idle_connections_past_the_descriptors_do_not_lock_out_a_good_client(tmp_path: Path) -> None:
    # 100 descriptors (soft; raised to the hard 128 at start): a backlog of 16 and 128 - 64 - 3 * 16 = 16
    # connections.
    flags = ("--header-timeout", "600")  # the cap, not the head deadline, must let the good client in
    with scorekit_serve(tmp_path, *flags, open_files=(100, 128)) as (proc, live, log):
        assert log_lines(log, "raised the open-file limit from 100 to 128"), log.read_text()[-3000:]
        assert log_lines(log, "up to 16 open connections and a listen backlog of 16")
        flood = 150  # more connections than the process has descriptors
        with _sockets(live, flood) as idle:
            status, _, raw = live.request("POST", "/rerank", GOOD, timeout=30)
            assert status == 200, raw[:300]
            # Counts, not timing: with at most 16 open, the server closed at least the surplus.
            closed = _count_closed(idle, flood - 16, timeout=30)
            assert closed >= flood - 16, closed
            for sock in idle:
                reset(sock)
        assert live.request("GET", "/health", timeout=30)[0] == 200
        proc.terminate()
        assert proc.wait(60) == 0
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "out of system resource" not in text, text[-3000:]  # the process never ran out of descriptors
    assert len(log_lines(log, "sent no complete request head")) == 1, text[-3000:]  # once a minute


def test_a_connect_and_reset_flood_logs_a_bounded_number_of_lines(tmp_path: Path) -> None:
    with scorekit_serve(tmp_path, open_files=(64, 64)) as (proc, live, log):
        before = len(log.read_text().splitlines())
        for _ in range(2):  # 100 connections, more than the process has descriptors, held and then reset
            with _sockets(live, 100) as flood:
                for sock in flood:
                    reset(sock)
        assert live.request("POST", "/rerank", GOOD, timeout=30)[0] == 200
        proc.terminate()
        assert proc.wait(60) == 0
    lines = log.read_text().splitlines()[before:]
    # Before: asyncio logged "socket.accept() out of system resource" with a traceback per failed accept,
    # tens of thousands of lines for this flood. Now: the request's access line, a throttled warning or
    # two, and the shutdown.
    assert len(lines) < 30, "\n".join(lines[:60])
    assert not any("Traceback" in line for line in lines)


def test_slowloris_and_idle_connections_are_closed_after_the_header_timeout(tmp_path: Path) -> None:
    header_timeout = 2
    with scorekit_serve(tmp_path, "--header-timeout", str(header_timeout)) as (proc, live, _log):
        started = time.monotonic()  # before any connection, so no deadline was armed before it
        with _sockets(live, 20) as slow, _sockets(live, 5) as idle:
            for sock in slow:
                sock.sendall(b"POST /rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            cut: set[int] = set()
            # One byte per connection every half second, for at most 10x the timeout.
            while len(cut) < len(slow) and time.monotonic() - started < 10 * header_timeout:
                for i, sock in enumerate(slow):
                    if i in cut:
                        continue
                    try:
                        sock.sendall(b"a")
                    except OSError:
                        cut.add(i)
                        continue
                    if _closed_by_server(sock):
                        cut.add(i)
                # A good client gets in meanwhile.
                assert live.request("POST", "/rerank", GOOD, timeout=30)[0] == 200
                time.sleep(0.5)
            assert len(cut) == len(slow), f"{len(slow) - len(cut)} slowloris connections still open"
            assert time.monotonic() - started >= header_timeout  # not before their deadline
            assert _count_closed(idle, len(idle), timeout=10 * header_timeout) == len(idle)
        proc.terminate()
        assert proc.wait(60) == 0
