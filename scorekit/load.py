"""The server load counter (requests in flight, in total and per route) and the cells it counts in.

One counter per app. Every change is a plain synchronous statement, so a cancelled task can never skip one (an
``await`` in a ``finally`` could be cancelled again).

A server of several front-end processes (``--api-processes N``) counts in a :class:`Board`: a small file that
every front end maps, one row per front end and one column per counter. A process writes only its own row, so
no lock is taken on the hot path and no increment is lost; a reader sums the column, which is the exact count
over every front end at that instant (each row is exact; no share is estimated). The supervisor clears a dead
front end's row: its requests died with its connections. In one process the cells are plain integers.

Below the front ends' rows the board has one row more, of words that every front end reads and writes (a key's
quota bucket, ``middleware/quota.py``): each is changed under the board's file lock (:meth:`Board.locked`), so
two front ends never both spend what one bucket held. No front end's death clears them.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

# The board's layout: a table of column names, then the front ends' rows of 8-byte counters, then the shared row.
COLUMNS = 512
ROWS = 64
NAME_BYTES = 256  # a counter is named by its kind and a served model name: a hub id runs past 100 bytes
_NAMES = COLUMNS * NAME_BYTES
_SIZE = _NAMES + (ROWS + 1) * COLUMNS * 8


class Cell(Protocol):
    """One counter: this process adds to it; ``value`` is the count over every front-end process."""

    def add(self, n: int) -> None: ...

    @property
    def here(self) -> int:
        """This process's share."""
        ...

    @property
    def value(self) -> int:
        """The count over every front-end process (this one's alone without a board)."""
        ...


class LocalCell:
    """A cell of one process: an integer."""

    __slots__ = ("_n",)

    def __init__(self) -> None:
        self._n = 0

    def add(self, n: int) -> None:
        self._n += n

    @property
    def here(self) -> int:
        return self._n

    @property
    def value(self) -> int:
        return self._n


class Board:
    """The counters every front-end process of one server shares, in the file at ``path`` (``--api-processes``).

    The supervisor makes it (:meth:`create`) and gives each front end a row (:meth:`attach`); a front end names
    its counters (:meth:`cell`), and the first process to name one claims its column under a file lock, so every
    process finds the same column whatever order they start in. Counts are 8-byte aligned words: a reader never
    sees half a write."""

    def __init__(self, path: Path, row: int | None) -> None:
        self.path = path
        self.row = row
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, _SIZE)
        self._counts = memoryview(self._map)[_NAMES:].cast("q")
        self._columns: dict[str, int] = {}
        self._threads = threading.RLock()  # :meth:`locked`'s, for the threads of this process
        self._depth = 0  # how deep this process is in :meth:`locked`

    @classmethod
    def create(cls, path: Path) -> Board:
        """A new board, every count zero; the creator has no row (it reads and clears)."""
        with path.open("wb") as file:
            file.truncate(_SIZE)
        return cls(path, None)

    @classmethod
    def attach(cls, path: Path, row: int) -> Board:
        """Front end ``row``'s view of the board at ``path``."""
        return cls(path, _checked(row))

    def cell(self, name: str) -> SharedCell:
        """This process's cell of the counter ``name``."""
        if self.row is None:
            raise RuntimeError("the board's creator has no row to count in")
        return SharedCell(self._counts, self.row, self._column(name))

    def shared(self, name: str) -> SharedWord:
        """The word ``name`` of the shared row: read and written by every front end, under :meth:`locked`."""
        return SharedWord(self._counts, ROWS * COLUMNS + self._column(name))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The board's file lock, held by one process at a time and, within it, one thread (a flock is the open
        file's, which every thread of the process shares): a shared word's read and write, together. Re-entered
        (a counter named while it is held), it is let go only by the outermost."""
        with self._threads:
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def totals(self, prefix: str) -> dict[str, int]:
        """Every counter whose name starts with ``prefix`` and is not zero, by the rest of its name: summed over
        the rows."""
        found = {}
        for name, column in self._named().items():
            if name.startswith(prefix) and (total := _column_sum(self._counts, column)):
                found[name[len(prefix) :]] = total
        return found

    def clear(self, row: int) -> None:
        """Zero every count of ``row``: its front end is gone, and its requests with it."""
        start = _checked(row) * COLUMNS  # a negative row would index from the end: another front end's row
        for column in range(COLUMNS):
            self._counts[start + column] = 0

    def close(self) -> None:
        self._counts.release()
        self._map.close()
        os.close(self._fd)

    def _column(self, name: str) -> int:
        if (column := self._columns.get(name)) is not None:
            return column
        encoded = name.encode()
        if not 0 < len(encoded) < NAME_BYTES or "\0" in name:  # NUL pads the names' table
            raise ValueError(f"a board's counter name takes 1 to {NAME_BYTES - 1} bytes, none NUL: {name!r}")
        with self.locked():  # the one flock of this descriptor: not let go early if the caller holds it
            named = self._named()
            column = named.get(name)
            if column is None:
                if len(named) == COLUMNS:
                    raise ValueError(f"the board's {COLUMNS} counters are all named")
                column = len(named)  # columns are claimed in order, never freed
                self._map[column * NAME_BYTES : column * NAME_BYTES + len(encoded)] = encoded
        self._columns[name] = column
        return column

    def _named(self) -> dict[str, int]:
        """The columns claimed so far, by name. Read without the lock (by :meth:`totals`), a name being claimed
        may be half written: it can only be undecodable (never trusted: replaced) or short, and either way its
        column counts zero, since nobody counts in a column before its name is whole."""
        named = {}
        for column in range(COLUMNS):
            raw = self._map[column * NAME_BYTES : (column + 1) * NAME_BYTES].rstrip(b"\0")
            if not raw:
                break
            named[raw.decode(errors="replace")] = column
        return named


def _checked(row: int) -> int:
    if not 0 <= row < ROWS:
        raise ValueError(f"a board has rows 0 to {ROWS - 1}, not {row}")
    return row


def _column_sum(counts: memoryview, column: int) -> int:
    return sum(counts[column : ROWS * COLUMNS : COLUMNS])  # the front ends' rows, not the shared one


class SharedWord:
    """One word of a board's shared row; read and written under the board's lock (``Board.locked``)."""

    __slots__ = ("_at", "_counts")

    def __init__(self, counts: memoryview, at: int) -> None:
        self._counts, self._at = counts, at

    @property
    def value(self) -> int:
        return int(self._counts[self._at])

    @value.setter
    def value(self, value: int) -> None:
        self._counts[self._at] = value


class SharedCell:
    """A counter on a :class:`Board`: this process's row is its share, the column's sum the value."""

    __slots__ = ("_at", "_column", "_counts")

    def __init__(self, counts: memoryview, row: int, column: int) -> None:
        self._counts = counts
        self._at = row * COLUMNS + column
        self._column = column

    def add(self, n: int) -> None:
        self._counts[self._at] += n

    @property
    def here(self) -> int:
        return int(self._counts[self._at])

    @property
    def value(self) -> int:
        return _column_sum(self._counts, self._column)


class LoadCounter:
    """Counts requests that are inside an owner lifecycle layer right now: over every front-end process when
    given a ``board``, else this process's."""

    def __init__(self, board: Board | None = None) -> None:
        self._board = board
        self._total: Cell = LocalCell() if board is None else board.cell("load")
        self._routes: dict[str, Cell] = {}
        self._routed_here = 0

    @property
    def total(self) -> int:
        return self._total.value

    @property
    def routed(self) -> int:
        """Requests in flight on routes that count as load (scoring, not /load or /health): the server's load,
        over every front-end process."""
        if self._board is not None:
            return sum(self._board.totals("route:").values())
        return self._routed_here

    @property
    def routed_here(self) -> int:
        """The requests of :attr:`routed` that this process serves: what its drain waits for."""
        return self._routed_here

    def per_route(self) -> dict[str, int]:
        """A snapshot, so a reader never sees a dict that changes under it."""
        if self._board is not None:
            return self._board.totals("route:")
        return {route: cell.here for route, cell in self._routes.items() if cell.here}

    def cell(self, name: str) -> Cell:
        """A counter of this server's besides the load (a model's admitted requests, its queue): on the board
        when there is one."""
        return LocalCell() if self._board is None else self._board.cell(name)

    def enter(self) -> None:
        self._total.add(1)

    def exit(self) -> None:
        self._total.add(-1)

    def enter_route(self, route: str) -> None:
        cell = self._routes.get(route)
        if cell is None:
            cell = self._routes[route] = LocalCell() if self._board is None else self._board.cell(f"route:{route}")
        cell.add(1)
        self._routed_here += 1

    def exit_route(self, route: str) -> None:
        self._routes[route].add(-1)
        self._routed_here -= 1
