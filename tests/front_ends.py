"""Which process of ``scorekit serve --api-processes N`` is which, read from /proc (Linux): the supervisor's
front ends and hosts, and the front end that accepted a given client connection (the kernel hands each new
connection to whichever front end accepts first, so a test finds out rather than choosing)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def _runs(pid: int, module: bytes) -> bool:
    try:
        return module in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def front_end_pids(supervisor: int) -> list[int]:
    return sorted(pid for pid in children(supervisor) if _runs(pid, b"scorekit.cli.front_end"))


def host_pids(supervisor: int) -> list[int]:
    return sorted(pid for pid in children(supervisor) if _runs(pid, b"scorekit.host"))


def _server_side_inode(client: socket.socket) -> int | None:
    """The inode of the accepted end of ``client``'s loopback TCP connection, from /proc/net/tcp."""
    ours = client.getsockname()[1]
    theirs = client.getpeername()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        if int(local.split(":")[1], 16) == theirs and int(remote.split(":")[1], 16) == ours and inode:
            return inode
    return None


def owner(client: socket.socket, candidates: list[int], timeout: float = 10.0) -> int:
    """The process among ``candidates`` that accepted ``client``'s connection (waited for: accepting is
    asynchronous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inode = _server_side_inode(client)
        if inode is not None:
            target = f"socket:[{inode}]"
            for pid in candidates:
                try:
                    descriptors = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in descriptors:
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                            return pid
                    except OSError:
                        continue
        time.sleep(0.01)
    raise AssertionError(f"no process of {candidates} accepted the connection from port {client.getsockname()[1]}")


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()
