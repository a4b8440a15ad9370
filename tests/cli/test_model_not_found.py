"""A model name that is not a folder, when the Hugging Face hub cannot be reached: said at once, in one line.

The hub here is a loopback port that reads each request's first line and closes the connection without an answer
(so every attempt is seen, and no test reaches past loopback); the cache is an empty or hand-made folder
(``HF_HUB_CACHE``). Before, such a name took 52 s of the hub client's retries, each warning printed twice, and then
"it has no config.json".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli.conftest import ROOT, one_line_error, scorekit
from tests.hardening.process import scorekit_serve
from tests.live import free_port


@dataclass
class Hub:
    url: str
    requests: list[str] = field(default_factory=list)  # "METHOD /path" of each connection, in order


@pytest.fixture
def hub() -> Iterator[Hub]:
    """A hub that is there but never answers: each request's line is noted, and its connection closed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    found = Hub(f"http://127.0.0.1:{listener.getsockname()[1]}")

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                connection.settimeout(5)
                try:
                    line = connection.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    line = "(nothing)"
                found.requests.append(" ".join(line.split()[:2]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield found
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (closing alone would not: it waits out the join)
    listener.close()
    thread.join(10)


def hub_env(hub: Hub, cache: Path, offline: bool = False) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1" if offline else "0",
        "TRANSFORMERS_OFFLINE": "0",
    }


def test_a_name_neither_a_folder_nor_reachable_is_one_line_at_once(hub: Hub, tmp_path: Path) -> None:
    result = scorekit("serve", "org/no-such-model", "--port", str(free_port()), env=hub_env(hub, tmp_path))
    line = one_line_error(result, 1)
    assert line == (
        "scorekit: error: Model 'org/no-such-model' is not a folder nor in the local Hugging Face cache, and the hub "
        f"cannot be reached at {hub.url} (--debug shows the traceback)"
    )
    assert hub.requests == ["HEAD /"]  # the one quick check, and no retries


def test_with_hf_hub_offline_the_hub_is_not_asked(hub: Hub, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path, offline=True)
    line = one_line_error(scorekit("serve", "org/no-such-model", "--port", str(free_port()), env=env), 1)
    assert line == (
        "scorekit: error: Model 'org/no-such-model' is not a folder nor in the local Hugging Face cache, and "
        "HF_HUB_OFFLINE is set, so the hub is not asked (--debug shows the traceback)"
    )
    assert hub.requests == []


def cache_model(cache: Path, name: str, folder: Path) -> None:
    """``folder`` as the hub client caches ``name``: its files in a snapshot that refs/main names."""
    revision = "0" * 40
    repo = cache / ("models--" + name.replace("/", "--"))
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def test_a_cached_model_is_served_from_the_cache_without_waiting_for_the_hub(
    hub: Hub, tmp_path: Path, cross_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_model(tmp_path / "cache", "org/tiny-ce", cross_encoder_dir)
    for name, value in hub_env(hub, tmp_path / "cache").items():
        monkeypatch.setenv(name, value)
    with scorekit_serve(tmp_path, "org/tiny-ce") as (proc, live, log):
        status, answer = live.json("POST", "/rerank", {"query": "q", "documents": ["a", "b"]})
        assert status == 200 and answer["model"] == "org/tiny-ce", answer
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    # The quick check, and no model file asked of the hub: each came from the cache. (huggingface_hub may also
    # ask once for its registry of agents, /api/agent-harnesses, for its User-Agent: its own, not a retry.)
    assert hub.requests.count("HEAD /") == 1, hub.requests
    assert not [request for request in hub.requests if "tiny-ce" in request], hub.requests
    assert len(set(hub.requests)) == len(hub.requests), hub.requests
    assert "Retrying" not in log.read_text()


HUB_WARNING = """
import logging.config, sys
from scorekit.logs import process_config, route_transformers
logging.config.dictConfig(process_config("info"))
route_transformers("info")
from huggingface_hub.utils import logging as hub_logging
hub_logging.get_logger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
"""


def test_a_hub_warning_is_logged_once_in_the_one_format() -> None:
    result = subprocess.run(
        [sys.executable, "-c", HUB_WARNING], cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith(" WARNING huggingface_hub.utils._http: Retrying in 1s [Retry 1/5]."), lines
