"""Servers under test as subprocesses on free loopback ports, and what /proc says about them.

Each server is a real process (``scorekit serve``, or uvicorn with an app factory from bench/), so
the numbers include the HTTP server and never share an interpreter with the load generator.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This checkout first on the path, no proxies for loopback, and any overrides."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(extra or {})
    return env


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    ready_path: str = "/health"
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def status_kib(self, key: str) -> int:
        """A ``/proc/<pid>/status`` memory line (VmRSS, VmHWM) in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}; see {self.log}")
            url = f"http://{HOST}:{self.port}{self.ready_path}"
            with contextlib.suppress(OSError, urllib.error.URLError), NO_PROXY.open(url, timeout=2) as answer:
                if answer.status == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} was not ready after {timeout}s; see {self.log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def spawn_command(name: str, command: Sequence[str], log_dir: Path, ready_path: str, env: dict[str, str]) -> Server:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    port = int(command[command.index("--port") + 1])
    with log.open("wb") as handle:
        process = subprocess.Popen(
            list(command), cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    return Server(name, port, process, log, ready_path, list(command))


def spawn_scorekit(name: str, log_dir: Path, extra: Sequence[str] = (), env: dict[str, str] | None = None) -> Server:
    """``scorekit serve`` on the embedded model; access logs off (``--log-level warning``) as in production."""
    port = free_port()
    command = [sys.executable, "-m", "scorekit.cli", "serve", "--host", HOST, "--port", str(port)]
    command += ["--log-level", "warning", *extra]
    return spawn_command(name, command, log_dir, "/health", child_env(env))


def spawn_uvicorn(
    name: str, factory: str, log_dir: Path, ready_path: str = "/health", env: dict[str, str] | None = None
) -> Server:
    """``uvicorn <factory> --factory`` with the same settings for every app compared."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", factory, "--factory", "--host", HOST, "--port", str(port)]
    # asyncio and h11 as `scorekit serve` runs, so every app compared parses HTTP alike whatever is installed.
    command += ["--log-level", "warning", "--no-access-log", "--lifespan", "off", "--loop", "asyncio", "--http", "h11"]
    return spawn_command(name, command, log_dir, ready_path, child_env(env))


@contextlib.contextmanager
def running(*servers: Server, timeout: float = 180.0) -> Iterator[tuple[Server, ...]]:
    """Wait for every server (they start in parallel), and stop them all at the end."""
    try:
        for server in servers:
            server.wait_ready(timeout)
        yield servers
    finally:
        for server in servers:
            server.stop()
