"""CPU-time clocks from /proc: a process's own CPU seconds, and the whole machine's busy seconds.

Wall-clock throughput on a machine shared with other jobs swings by 2x within a minute. CPU seconds
spent per item by the process that did the work barely move with contention, so every throughput
ratio is also reported per CPU second, and each window records how many cores other jobs used.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (a model host process, and anything it started)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants: a server whose model runs in a child process."""
    total = process_cpu_s(pid)
    for child in children(pid):
        with contextlib.suppress(OSError):
            total += process_cpu_s(child)
    return total


def machine_busy_s() -> float:
    """CPU seconds every core spent not idle since boot (iowait counts as idle)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / _TICK


@dataclass(frozen=True, slots=True)
class Reading:
    wall: float
    server: float
    own: float
    machine: float

    @classmethod
    def take(cls, pid: int | None, tree: bool = False) -> Reading:
        """``tree`` counts the server's child processes as the server (their CPU while they live)."""
        server = (tree_cpu_s(pid) if tree else process_cpu_s(pid)) if pid else 0.0
        return cls(
            wall=time.perf_counter(),
            server=server,
            own=time.process_time(),
            machine=machine_busy_s(),
        )

    def minus(self, earlier: Reading) -> dict[str, float]:
        """CPU seconds between two readings, and the cores that processes other than these two kept busy."""
        wall = self.wall - earlier.wall
        server, own = self.server - earlier.server, self.own - earlier.own
        others = max(0.0, self.machine - earlier.machine - server - own)
        return {
            "wall_s": wall,
            "server_cpu_s": server,
            "own_cpu_s": own,
            "other_cores": others / wall if wall > 0 else 0.0,
        }
