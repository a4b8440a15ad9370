"""``scorekit serve --model-host process`` as a process: a host that cannot load its weights is the command's one
line and exit 1 before the port serves; a host that dies drains the server, which exits with its own status and
a line naming the model and the host's exit status; Ctrl-C (SIGINT to the process group, host included) drains
and stops the host as SIGTERM does. Every wait is bounded."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from scorekit.serving import HOST_DIED_EXIT
from tests.cli.conftest import ROOT, scorekit
from tests.hardening.process import log_lines, scorekit_serve, until
from tests.live import Live, free_port


def _host_pid(server: int) -> int:
    """The model host process the server started (its one child running ``python -m scorekit.host``)."""
    for child in Path(f"/proc/{server}/task/{server}/children").read_text().split():
        command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"scorekit.host" in command:
            return int(child)
    raise AssertionError(f"no model host process among the children of {server}")


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def test_a_host_that_cannot_load_its_weights_is_one_line_and_exit_1(cross_encoder_dir: Path, tmp_path: Path) -> None:
    """The server's copy loads without weights (the config and tokenizer are good); the host fails on them."""
    folder = tmp_path / "corrupt"
    shutil.copytree(cross_encoder_dir, folder)
    (weights,) = folder.glob("*.safetensors")
    weights.write_bytes(b"not a safetensors file")
    port = free_port()
    result = scorekit("serve", str(folder), "--model-host", "process", "--port", str(port))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]  # after the log lines of the server's weightless copy
    assert line.startswith(f"scorekit: error: Model '{folder}' could not be loaded (SafetensorError)"), line
    assert line.endswith("(the model host exited with status 1) (--debug shows the traceback)"), line
    assert result.stderr.count("could not be loaded") == 1, result.stderr[-3000:]  # said once, by the server
    assert "serving on" not in result.stderr  # before the port served anything


def test_a_host_that_dies_drains_the_server_which_exits_with_its_own_status(
    cross_encoder_dir: Path, tmp_path: Path
) -> None:
    with scorekit_serve(tmp_path, f"tiny-ce={cross_encoder_dir}", "--model-host", "process") as (proc, _, log):
        host = _host_pid(proc.pid)
        os.kill(host, signal.SIGKILL)
        assert proc.wait(timeout=30) == HOST_DIED_EXIT, log.read_text()[-3000:]
    line = f"scorekit: error: the model host process of model 'tiny-ce' exited with status {-signal.SIGKILL}"
    assert log_lines(log, line) == [line], log.read_text()[-3000:]
    assert log_lines(log, "draining")
    assert _gone(host)


def test_ctrl_c_drains_and_stops_the_host(cross_encoder_dir: Path, tmp_path: Path) -> None:
    """A terminal's Ctrl-C is SIGINT to the whole process group: the host ignores it, the server drains, stops
    the host and exits 0, as on SIGTERM."""
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "scorekit.cli", "serve", str(cross_encoder_dir), "--model-host", "process"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        live = Live("127.0.0.1", port)
        until(lambda: _healthy(live, proc), 120, "scorekit serve did not become healthy")
        host = _host_pid(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert log_lines(log, "draining"), log.read_text()[-3000:]
        until(lambda: _gone(host), 10, "the model host outlived the server")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _healthy(live: Live, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, f"scorekit serve exited with {proc.returncode}"
    try:
        return live.request("GET", "/health", timeout=2)[0] == 200
    except OSError:
        return False
