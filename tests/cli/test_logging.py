"""Start-up logs: one format under `scorekit serve`, no progress bars, the facts an operator needs; and when
embedded in a host with no logging set up, scorekit's start-up lines still show."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cli.conftest import ROOT
from tests.hardening.process import scorekit_serve, until
from tests.live import Live, free_port

# asctime, level, logger: every line of `scorekit serve`, scorekit's and uvicorn's alike.
LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: \S")


def test_serve_logs_in_one_format_with_the_start_up_facts(tmp_path: Path, cross_encoder_dir: Path) -> None:
    with scorekit_serve(tmp_path, str(cross_encoder_dir)) as (proc, live, log):
        status, _ = live.json("POST", "/rerank", {"query": "q", "documents": ["d"]})
        assert status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    lines = log.read_text().splitlines()
    assert [line for line in lines if not LINE.match(line)] == []
    text = "\n".join(lines)
    assert "Loading weights" not in text and "LOAD REPORT" not in text
    loaded = re.search(
        r"scorekit\.models: loaded (.+) \(cross-encoder\) on cpu in float32 in [\d.]+ s; inputs up to "
        r"128 tokens$",
        text,
        re.MULTILINE,
    )
    assert loaded is not None and loaded.group(1) == str(cross_encoder_dir), text
    serving = r"scorekit\.app: scorekit 0\.1\.0 serving .+ \(cross-encoder, inputs up to 128 tokens\) as '.+'; "
    assert re.search(serving + r"batches of up to 16384 padded tokens \(the CPU default\)$", text, re.MULTILINE)
    assert re.search(r"scorekit\.serving: serving on http://127\.0\.0\.1:\d+ \(Ctrl-C drains", text)
    assert re.search(r'uvicorn\.access: 127\.0\.0\.1:\d+ - "POST /rerank HTTP/1\.1" 200', text)


HOST_APP = """
import sys
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from scorekit import create_app
from scorekit.settings import Settings

scoring = create_app(Settings.for_model(sys.argv[1], max_body_bytes=1 << 20))


@asynccontextmanager
async def lifespan(app):
    async with scoring.lifespan():
        yield


app = Starlette(routes=[Mount("/scoring", app=scoring)], lifespan=lifespan)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]))
"""


def test_embedded_start_up_lines_show_without_a_logging_config(tmp_path: Path, cross_encoder_dir: Path) -> None:
    """A Starlette host under uvicorn's default logging: the root logger has no handler, and scorekit's INFO
    lines used to fall to logging's last resort, which prints warnings only."""
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(HOST_APP))
    port = free_port()
    log = tmp_path / "host.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(cross_encoder_dir), str(port)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's scorekit, next to the script
            stdout=out,
            stderr=out,
        )
    try:
        live = Live("127.0.0.1", port)
        # uvicorn logs "Application startup complete" when the lifespan is up and "Uvicorn running on" only once
        # its socket listens: waiting for the first raced the bind and met a refused connection on a loaded machine.
        until(lambda: "Uvicorn running on" in log.read_text() or proc.poll() is not None, 120, "start-up")
        assert proc.poll() is None, log.read_text()
        assert live.json("POST", "/scoring/rerank", {"query": "q", "documents": ["d"]})[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    text = log.read_text()
    assert re.search(r"INFO scorekit\.models: loaded .+ \(cross-encoder\) on cpu in float32", text), text
    assert re.search(r"INFO scorekit\.app: scorekit 0\.1\.0 serving .+ \(cross-encoder", text), text
    assert "Loading weights" not in text
