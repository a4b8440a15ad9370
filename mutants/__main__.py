"""The mutation check: every mutant in ``mutants/catalog.py`` must make its tests fail.

Run it with ``make mutants`` (or ``.venv/bin/python -m mutants``; ``--only L01 B03`` for some, ``--list``
to print the catalogue). The working tree is never touched, so it is safe while others edit it:

1. ``scorekit/``, ``tests/`` and ``pyproject.toml`` are copied into a temporary folder;
2. every mutant's pattern is checked against that copy first: a pattern that no longer occurs exactly once
   stops the run before any test (the catalogue has drifted from the source and must be updated);
3. the tests the catalogue names are run once on the unmutated copy (they must pass, or a "caught" would
   mean nothing);
4. for each mutant, its file in the copy is rewritten with the one substitution, its tests run in a fresh
   ``python`` (``pytest -x``, from the copy, the copy first on ``PYTHONPATH``), and the file is restored.
   That subprocess first checks that ``scorekit`` really comes from the copy, and at the end that every
   ``scorekit`` module it loaded did; otherwise the run stops.

A mutant is caught when its tests fail (or run past ``--timeout``, a hang). The run prints caught/total and
the time taken, and exits 1 when a mutant survives, 2 when the catalogue or the baseline is broken.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mutants.catalog import MUTANTS, Mutant

REPO = Path(__file__).resolve().parent.parent
COPIED = ("scorekit", "tests", "bench", "pyproject.toml")  # tests import bench (its corpus, its scorers)
FOREIGN_IMPORT = 97  # the probe's exit status when scorekit did not come from the copy

# Runs pytest in the subprocess, after proving that the scorekit it imports is the copy's.
PROBE = """
import sys
root = sys.argv[1]
import scorekit
if not scorekit.__file__.startswith(root):
    print("scorekit was imported from", scorekit.__file__, "not from the copy in", root)
    sys.exit(97)
import pytest
status = pytest.main(sys.argv[2:])
foreign = sorted(
    name for name, module in list(sys.modules.items())
    if name.split(".")[0] == "scorekit" and not (getattr(module, "__file__", None) or root).startswith(root)
)
if foreign:
    print("modules loaded from outside the copy:", foreign)
    sys.exit(97)
sys.exit(int(status))
"""


class CatalogueError(Exception):
    """The catalogue no longer matches the source, or the unmutated tests fail."""


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    caught: bool
    how: str
    seconds: float


def copy_tree(into: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=ignore)
        else:
            shutil.copy2(source, into / name)


def check_patterns(root: Path, mutants: Sequence[Mutant]) -> None:
    """Every pattern must occur exactly once in its file, and the replacement must change it."""
    problems = []
    for mutant in mutants:
        text = (root / mutant.file).read_text()
        count = text.count(mutant.pattern)
        if count != 1:
            problems.append(f"{mutant.id}: its pattern occurs {count} times in {mutant.file} (expected once)")
        if mutant.pattern == mutant.replacement:
            problems.append(f"{mutant.id}: the replacement equals the pattern")
    ids = [mutant.id for mutant in mutants]
    problems += [f"{dup}: the id is used twice" for dup in sorted({i for i in ids if ids.count(i) > 1})]
    if problems:
        raise CatalogueError("the mutant catalogue has drifted from the source:\n  " + "\n  ".join(problems))


def run_tests(root: Path, tests: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """Run ``tests`` against the package in ``root``; (exit status or None on timeout, output)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [
        sys.executable,
        "-c",
        PROBE,
        str(root),
        "-x",
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:schemathesis",
        *tests,
    ]
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the pytest run and anything it started
        output, _ = process.communicate()
        return None, output
    return process.returncode, output


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if re.match(r"(FAILED|ERROR) \S+::", line):
            return line.split(" - ")[0]
    return "a failing test"


def try_mutant(root: Path, mutant: Mutant, timeout: float) -> Result:
    path = root / mutant.file
    original = path.read_text()
    started = time.monotonic()
    try:
        path.write_text(original.replace(mutant.pattern, mutant.replacement, 1))
        status, output = run_tests(root, mutant.tests, timeout)
    finally:
        path.write_text(original)
    seconds = time.monotonic() - started
    if status == FOREIGN_IMPORT:
        raise CatalogueError(f"{mutant.id}: the tests did not run against the mutated copy:\n{output[-2000:]}")
    if status is None:
        return Result(mutant, True, f"timed out after {timeout:.0f} s (a hang)", seconds)
    if status == 1:
        return Result(mutant, True, first_failure(output), seconds)
    if status == 0:
        return Result(mutant, False, "every test passed", seconds)
    raise CatalogueError(f"{mutant.id}: pytest exited with status {status}:\n{output[-2000:]}")


def select(only: Sequence[str]) -> list[Mutant]:
    if not only:
        return list(MUTANTS)
    known = {mutant.id: mutant for mutant in MUTANTS}
    unknown = [i for i in only if i not in known]
    if unknown:
        raise CatalogueError(f"no such mutant: {', '.join(unknown)}")
    return [known[i] for i in only]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=[], metavar="ID", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2: two cores)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant before it counts as a hang")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        mutants = select(args.only)
    except CatalogueError as exc:
        parser.error(str(exc))
    if args.list:
        for mutant in mutants:
            print(f"{mutant.id}  {mutant.file}  {mutant.bug}")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scorekit-mutants-") as temp:
        roots = [Path(temp) / f"copy{slot}" for slot in range(args.jobs)]
        try:
            for root in roots:
                copy_tree(root)
            check_patterns(roots[0], mutants)
            baseline = sorted({test for mutant in mutants for test in mutant.tests})
            print(f"baseline: {len(baseline)} test selections on the unmutated copy ...", flush=True)
            status, output = run_tests(roots[0], baseline, args.timeout * 4)
            if status != 0:
                raise CatalogueError(f"the tests fail without any mutant (status {status}):\n{output[-3000:]}")
            results = run_all(roots, mutants, args.timeout)
        except CatalogueError as exc:
            print(f"mutation check broken: {exc}", file=sys.stderr)
            return 2
    survivors = [r for r in results if not r.caught]
    elapsed = time.monotonic() - started
    print(f"\ncaught {len(results) - len(survivors)}/{len(results)} mutants in {elapsed:.0f} s")
    for result in survivors:
        print(f"SURVIVED {result.mutant.id}: {result.mutant.bug} ({result.mutant.file})")
    return 1 if survivors else 0


def run_all(roots: list[Path], mutants: list[Mutant], timeout: float) -> list[Result]:
    """Test the mutants, ``len(roots)`` at a time, each copy used by one mutant at once."""
    free = list(roots)
    lock = threading.Lock()

    def one(mutant: Mutant) -> Result:
        with lock:
            root = free.pop()
        try:
            result = try_mutant(root, mutant, timeout)
        finally:
            with lock:
                free.append(root)
        verdict = "caught  " if result.caught else "SURVIVED"
        print(f"{verdict} {mutant.id} ({result.seconds:4.0f} s) {mutant.bug}: {result.how}", flush=True)
        return result

    with ThreadPoolExecutor(len(roots)) as pool:
        return list(pool.map(one, mutants))


if __name__ == "__main__":
    sys.exit(main())
