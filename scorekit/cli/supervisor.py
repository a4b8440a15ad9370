"""``scorekit serve --api-processes N``: the supervisor of N front-end processes that share the port and feed one
model host process per model.

Start-up: a run directory (the load board every front end counts on, :class:`~scorekit.load.Board`; the Prometheus
directory their metrics aggregate in; one Unix socket per model host, where front ends join it); each model's host
process started and loaded (it refuses in one line, as ``--model-host process`` does); then N front ends
(:mod:`scorekit.cli.front_end`), each handed its own socket on the port and its row of the board. The sockets
share the port with SO_REUSEPORT, so the kernel spreads new connections evenly over the front ends; this process
holds them all, so the connections that reach a dead front end's socket wait for its replacement. The server
serves once every front end does.

While serving: a front end that dies is replaced in its row (cleared first: its requests died with its
connections, so /load returns to 0); a host that dies ends the server, as in one process: every front end answers
503 at once, drains and exits, and so does this process, with :data:`~scorekit.serving.HOST_DIED_EXIT` and one line.
A front end that cannot start (it never served) ends the server with its one line and exit 1: a replacement would
fail the same way.

Shutdown: the first SIGTERM or SIGINT drains every front end (SIGTERM to each, whose drain keeps today's rules);
a second one cuts what they still run. Once every front end has exited, the hosts finish what is queued and stop.
The front ends run in sessions of their own, so a terminal's Ctrl-C reaches this process alone, which passes it on
once (the hosts ignore SIGINT).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from scorekit.cli.front_end import FAILED, SERVING, Assignment, send_assignment
from scorekit.host.client import HostClient, HostStartError
from scorekit.load import Board
from scorekit.serving import HOST_DIED_EXIT

logger = logging.getLogger("scorekit.supervisor")
# How often the supervisor looks at its front ends and hosts.
_POLL_S = 0.05
# Seconds past the shutdown timeout a front end gets to exit before it is killed.
_EXIT_GRACE_S = 10.0


class _Unobserved:
    """The hosts' observer here: their batches are reported to a front end, whose metrics count them."""

    def batch(self, size: int, tokens: int, seconds: float) -> None:
        pass

    def dropped(self, items: int) -> None:
        pass


@dataclass
class _FrontEnd:
    row: int
    process: subprocess.Popen[bytes]
    control: socket.socket
    serving: bool = False
    signalled: bool = False
    failure: str | None = None  # the one line it sent when it could not start


@dataclass
class Supervisor:
    args: argparse.Namespace
    socks: list[socket.socket]  # the port's, one per front end (SO_REUSEPORT), held here for a replacement
    run_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="scorekit-")))
    signals: int = 0
    announced: bool = False  # the line saying where it serves was logged: a replacement's start is news
    hosts: dict[str, HostClient] = field(default_factory=dict)
    front_ends: list[_FrontEnd] = field(default_factory=list)

    def run(self) -> int:
        """Serve until a signal ends the drain or a host dies; the process's exit status."""
        previous = {sig: signal.signal(sig, self._signalled) for sig in (signal.SIGTERM, signal.SIGINT)}
        board = Board.create(self.run_dir / "load")
        (self.run_dir / "metrics").mkdir()
        try:
            try:
                self._start_hosts()
            except HostStartError as exc:
                return _error(str(exc), 1)
            if (status := self._start_front_ends()) is not None:
                return status
            return self._serve(board)
        finally:
            self._stop_front_ends()
            for client in self.hosts.values():
                client.stop(self.args.settings.shutdown_timeout)
            board.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _signalled(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1  # the loop acts on it: a handler runs between any two bytecodes

    def _start_hosts(self) -> None:
        for index, spec in enumerate(self.args.settings.models):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address = str(self.run_dir / f"host-{index}.sock")
            listener.bind(address)
            listener.listen(64)
            client = HostClient(spec, observer=_Unobserved(), listener=listener)
            try:
                client.start()  # blocks until the host has loaded the model, or raises its one line
            finally:
                listener.close()  # the host holds it now
            self.hosts[spec.served_name] = client

    def _start_front_ends(self) -> int | None:
        """Start every front end and wait until each serves: None then, else the exit status."""
        count = self.args.api_processes
        self.front_ends = [self._spawn(row) for row in range(count)]
        while not all(front_end.serving for front_end in self.front_ends):
            if self.signals:
                return 130
            if (dead := self._dead_host()) is not None:
                return _error(dead, HOST_DIED_EXIT)
            for front_end in self.front_ends:
                self._listen(front_end)
                if front_end.process.poll() is not None and not front_end.serving:
                    return _error(self._failed_start(front_end), 1)
            time.sleep(_POLL_S)
        pids = ", ".join(str(front_end.process.pid) for front_end in self.front_ends)
        hosts = ", ".join(f"{name} (pid {client.pid})" for name, client in self.hosts.items())
        shown = f"[{self.args.host}]" if ":" in self.args.host else self.args.host
        self.announced = True
        logger.info(
            "serving on http://%s:%d: %d front-end processes (pids %s) feeding the model host of %s (Ctrl-C drains;"
            " a second Ctrl-C stops at once)",
            shown,
            self.args.port,
            count,
            pids,
            hosts,
        )
        return None

    def _serve(self, board: Board) -> int:
        drained = 0  # the signals passed on to the front ends
        host_died: str | None = None
        while True:
            if self.signals > drained:
                drained = self.signals
                self._signal_front_ends()
            if host_died is None and (host_died := self._dead_host()) is not None:
                logger.critical("%s: every front end drains and exits", host_died)
            stopping = drained > 0 or host_died is not None
            for index, front_end in enumerate(self.front_ends):
                self._listen(front_end)
                status = front_end.process.poll()
                if status is not None and stopping:
                    self.socks[front_end.row].close()  # no one accepts there any more: refuse, do not queue
                if status is None or stopping:
                    continue
                if not front_end.serving:
                    return _error(self._failed_start(front_end), 1)
                logger.error(
                    "front-end process %d (pid %d) exited with status %d: replaced",
                    front_end.row,
                    front_end.process.pid,
                    status,
                )
                front_end.control.close()
                board.clear(front_end.row)
                self.front_ends[index] = self._spawn(front_end.row)
            if stopping and all(front_end.process.poll() is not None for front_end in self.front_ends):
                break
            time.sleep(_POLL_S)
        if host_died is not None:
            return _error(host_died, HOST_DIED_EXIT)
        logger.info("every front end has drained: stopping the model host process(es)")
        return 0

    def _spawn(self, row: int) -> _FrontEnd:
        ours, theirs = socket.socketpair()
        listen_fd = self.socks[row].fileno()
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.run_dir / "metrics")}
        command = [sys.executable, "-m", "scorekit.cli.front_end", "--listen-fd", str(listen_fd)]
        process = subprocess.Popen(
            [*command, "--control-fd", str(theirs.fileno())],
            pass_fds=(listen_fd, theirs.fileno()),
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C is this process's to pass on, once
        )
        theirs.close()
        args = self.args
        hosts = {name: str(self.run_dir / f"host-{index}.sock") for index, name in enumerate(self.hosts)}
        assignment = Assignment(args.settings, row, str(self.run_dir), hosts, args.host, args.port, args.log_level)
        send_assignment(ours, assignment)
        ours.setblocking(False)
        return _FrontEnd(row, process, ours)

    def _listen(self, front_end: _FrontEnd) -> None:
        """Read what the front end said: that it serves, or why it cannot start."""
        try:
            said = front_end.control.recv(4096)
        except (BlockingIOError, OSError):
            return
        if said.startswith(SERVING):
            front_end.serving = True
            if self.announced:
                logger.info("front-end process %d (pid %d) serves", front_end.row, front_end.process.pid)
        elif said.startswith(FAILED):
            front_end.failure = said[len(FAILED) :].decode(errors="replace")

    def _failed_start(self, front_end: _FrontEnd) -> str:
        self._listen(front_end)
        why = front_end.failure or f"it exited with status {front_end.process.returncode}"
        return f"front-end process {front_end.row} could not start: {why}"

    def _dead_host(self) -> str | None:
        return next((line for client in self.hosts.values() if (line := client.death_line) is not None), None)

    def _signal_front_ends(self) -> None:
        for front_end in self.front_ends:
            if front_end.process.poll() is None:
                front_end.signalled = True
                front_end.process.send_signal(signal.SIGTERM)

    def _stop_front_ends(self) -> None:
        """Wait for every front end to exit (bounded by the drain's timeout), killing one that does not."""
        deadline = time.monotonic() + self.args.settings.shutdown_timeout + _EXIT_GRACE_S
        for front_end in self.front_ends:
            if front_end.process.poll() is None and not front_end.signalled:
                front_end.process.send_signal(signal.SIGTERM)  # an early return, or a host died: drain now
            try:
                front_end.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("front-end process %d did not exit: killed", front_end.row)
                front_end.process.kill()
                front_end.process.wait()
            front_end.control.close()


def _error(line: str, status: int) -> int:
    print(f"scorekit: error: {line.rstrip('.')}", file=sys.stderr, flush=True)
    return status


def supervise(args: argparse.Namespace, socks: list[socket.socket]) -> int:
    """Serve with ``args.api_processes`` front ends, one on each of ``socks`` (bound to the port); the exit
    status."""
    return Supervisor(args, socks).run()
