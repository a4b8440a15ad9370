"""Suite-wide settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the whole suite: on a small shared machine two OpenMP threads that
    fight the in-process server and its clients for the cores make a tiny batch over ten times
    slower, and the tests measure behaviour, not throughput (bench/ measures throughput)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
