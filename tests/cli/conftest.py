"""The `scorekit` command: parsed in-process where that is enough, run as a process where start-up is the point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import build_cross_encoder

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


def scorekit(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m scorekit ARGS`` to completion, with no SCOREKIT_* variable but those in ``env``."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("SCOREKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "scorekit", *args],
        cwd=ROOT,
        env={**clean, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The process failed with ``code`` and said why in exactly one line on stderr, with no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]
