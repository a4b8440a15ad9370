"""A real model host process for the tests: its client, a recording observer, and a job run through it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from scorekit.host.client import HostClient
from scorekit.model_job import ModelJob
from scorekit.models.base import Encoded
from scorekit.settings import ModelSpec
from tests.tiny_models import build_cross_encoder

# Seconds any one wait on the host may take before the test fails: a process start loads torch and a model.
START = 120.0
WAIT = 30.0
# Texts of several lengths, for jobs whose outputs differ.
DOCUMENTS = [
    "Paris is the capital of France.",
    "The mitochondria is the powerhouse of the cell.",
    "A short one.",
    "Berlin has been the capital of Germany since reunification, and before that of Prussia.",
    "Rain.",
]


@dataclass
class Recorder:
    """A host observer that keeps what it is told."""

    batches: list[tuple[int, int, float]] = field(default_factory=list)
    drops: list[int] = field(default_factory=list)

    def batch(self, size: int, tokens: int, seconds: float) -> None:
        self.batches.append((size, tokens, seconds))

    def dropped(self, items: int) -> None:
        self.drops.append(items)


class Waited:
    """A job and the event its ``notify`` sets."""

    def __init__(self, inputs: list[Encoded]) -> None:
        self.finished = threading.Event()
        self.job = ModelJob(inputs, notify=self.finished.set)

    def outputs(self, timeout: float = WAIT) -> list[torch.Tensor]:
        assert self.finished.wait(timeout), "the host never answered the job"
        assert self.job.error is None, self.job.error
        return self.job.outputs()


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


@contextmanager
def hosted(
    spec: ModelSpec, observer: Recorder | None = None, *, listener: socket.socket | None = None
) -> Iterator[HostClient]:
    """A started host for ``spec`` (front ends may join it at ``listener``); stopped after, and its process never
    left behind."""
    client = HostClient(
        spec, observer=observer or Recorder(), start_timeout=START, stats_timeout=WAIT, listener=listener
    )
    client.start()
    try:
        yield client
    finally:
        client.stop(timeout=WAIT)
        assert client.exit_status is not None
