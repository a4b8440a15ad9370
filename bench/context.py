"""What every scenario gets: the run's sizes, where to write, and the shared servers and inputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.corpus import RequestSet
from bench.driver import loadgen
from bench.profiles import Profile
from bench.servers import Server


@dataclass
class Context:
    profile: Profile
    out: Path  # JSON and PNG results
    work: Path  # request specs and server logs
    requests: RequestSet
    rerank_spec: Path
    servers: dict[str, Server]  # started once, in parallel, before the first scenario

    @property
    def scorekit(self) -> Server:
        """`scorekit serve` with the default settings, shared by the model scenarios."""
        return self.servers["scorekit"]

    def closed(self, server: Server, spec: Path, concurrency: int, **extra: Any) -> dict[str, Any]:
        """One closed-loop window of the load generator against ``server``."""
        p = self.profile
        args: list[object] = ["--spec", spec, "--concurrency", concurrency]
        args += ["--warmup", extra.pop("warmup", p.warmup_s), "--window", extra.pop("window", p.window_s)]
        args += ["--max-requests", p.max_requests, "--min-completed", extra.pop("min_completed", 2)]
        args += ["--pid", server.pid]
        if extra.pop("metrics", False):
            args.append("--metrics")
        return loadgen("closed", server.port, *args)
