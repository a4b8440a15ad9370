"""One front-end process of ``scorekit serve --api-processes N``: the whole request path (the lifecycle middleware,
routing, decoding, tokenizing) of a :class:`~scorekit.app.ScorekitApp` serving the shared port, whose models run in
the model host processes its supervisor started (:mod:`scorekit.cli.supervisor`).

The supervisor starts it as ``python -m scorekit.cli.front_end --listen-fd L --control-fd C``: L is its socket
on the port, C this process's end of a socket pair on which the supervisor sends its :class:`Assignment` and this
process answers :data:`SERVING` once it serves, or :data:`FAILED` and the one line saying why it cannot start.
The end of that stream (the supervisor is gone) drains this front end as SIGTERM does: no front end outlives its
supervisor.
"""

from __future__ import annotations

import argparse
import contextlib
import logging.config
import os
import signal
import socket
import struct
import sys
import threading
from pathlib import Path

import msgspec

from scorekit.logs import inherited_format, process_config, route_transformers
from scorekit.settings import Settings

SERVING = b"S"
FAILED = b"F"
_LENGTH = struct.Struct("!I")


class Assignment(msgspec.Struct, frozen=True):
    """What the supervisor tells a front end: the settings (every model hosted in a process), its row on the load
    board, the run directory (the board's file and the Prometheus directory), each model's host address by served
    name, and how to log."""

    settings: Settings
    row: int
    run_dir: str
    hosts: dict[str, str]
    host: str
    port: int
    log_level: str


def send_assignment(control: socket.socket, assignment: Assignment) -> None:
    payload = msgspec.msgpack.encode(assignment)
    control.sendall(_LENGTH.pack(len(payload)) + payload)


def _receive_assignment(control: socket.socket) -> Assignment | None:
    head = _read_exactly(control, _LENGTH.size)
    if head is None:
        return None
    payload = _read_exactly(control, _LENGTH.unpack(head)[0])
    return None if payload is None else msgspec.msgpack.decode(payload, type=Assignment)


def _read_exactly(control: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = control.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scorekit.cli.front_end", description=__doc__)
    parser.add_argument("--listen-fd", type=int, required=True, help="this front end's socket on the port")
    parser.add_argument("--control-fd", type=int, required=True, help="this process's end of the supervisor's pair")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    assignment = _receive_assignment(control)
    if assignment is None:  # the supervisor went away before it said what to serve
        return 1
    config = process_config(assignment.log_level, inherited_format())
    logging.config.dictConfig(config)
    # Heavy imports (torch, transformers, uvicorn) after the assignment.
    from scorekit.app import FrontEndGroup, ScorekitApp, load_models
    from scorekit.load import Board
    from scorekit.serving import run_server

    route_transformers(assignment.log_level)
    settings, run_dir = assignment.settings, Path(assignment.run_dir)
    try:
        group = FrontEndGroup(Board.attach(run_dir / "load", assignment.row), run_dir / "metrics", assignment.hosts)
        loaded = load_models(settings)  # every model hosted in a process: its plans, tokenizer and card, no weights
        app = ScorekitApp(settings, backends=loaded.backends, group=group)
        app.start_hosts()  # joins each model's host process
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        _tell(control, FAILED + (first or type(exc).__name__).encode())
        return 1
    threading.Thread(
        target=_drain_when_orphaned, args=(control,), name="scorekit-front-end-control", daemon=True
    ).start()
    return run_server(
        app,
        host=assignment.host,
        port=assignment.port,
        log_level=assignment.log_level,
        log_config=config,
        sock=socket.socket(fileno=args.listen_fd),
        started=lambda: _tell(control, SERVING),
    )


def _tell(control: socket.socket, news: bytes) -> None:
    """Tell the supervisor; one that is gone already is no error (the stream's end drains this front end)."""
    with contextlib.suppress(OSError):
        control.sendall(news)


def _drain_when_orphaned(control: socket.socket) -> None:
    """The supervisor holds the other end until it exits: when the stream ends, drain as on SIGTERM."""
    try:
        while control.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
