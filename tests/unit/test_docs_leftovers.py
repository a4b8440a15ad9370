"""What the docs' commands write in the repository root is covered by .gitignore.

The docs run their examples from the repository root: a tiny model built into a folder, a request body written
to a file with ``>``, an export cache or a key file named with ``./``. Each such name must be ignored, so that a
reader who follows the docs is not left with files for ``git add .`` to pick up (and a key file to commit).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A name a documented shell command writes in the folder it runs in.
WRITTEN = (
    re.compile(r"Path\('([A-Za-z0-9_.-]+)'\)"),  # build_causal_lm(Path('tiny-lm'))
    re.compile(r">\s*([A-Za-z][A-Za-z0-9_.-]*)\s*$", re.MULTILINE),  # ... > long.json
    re.compile(r"--(?:cache-dir|api-key-file) \./([A-Za-z0-9_.-]+)"),  # --cache-dir ./cache
)


def written_by_the_docs() -> set[str]:
    names: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for pattern in WRITTEN:
            names.update(pattern.findall(text))
    return names


def ignored_at_the_root() -> set[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip("/") for line in lines if line.startswith("/") and "*" not in line}


def test_what_the_docs_write_is_ignored() -> None:
    written = written_by_the_docs()
    assert {"tiny-lm", "long.json", "cache", "keys"} <= written  # the patterns still find the docs' commands
    assert written - ignored_at_the_root() == set()
