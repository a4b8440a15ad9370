"""The mutant catalogue stays applicable: every mutant's pattern occurs exactly once in its file, so a change that
rewrites the code a mutant targets fails here, in the suite, rather than only when someone runs the mutants."""

from __future__ import annotations

from pathlib import Path

from mutants.__main__ import check_patterns
from mutants.catalog import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


def test_every_pattern_occurs_once_in_its_file() -> None:
    check_patterns(ROOT, MUTANTS)  # raises, naming each drifted mutant
