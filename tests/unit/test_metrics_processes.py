"""/metrics over several front-end processes (``Metrics(..., processes=...)``): a scrape reaches one of them and
answers for all. Counters and histograms sum every process's prometheus-client multiprocess files, those of a
process gone included; the live gauges are read once, from owners that count over every front end (the load
board), never once per process.

prometheus-client picks its multiprocess mode when it is imported, so every process that counts or renders here
is a real one (``python -c``), started with ``PROMETHEUS_MULTIPROC_DIR`` set; this test process, which imported it
without, checks only the refusals.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import values

from scorekit.load import Board, LoadCounter
from scorekit.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]  # the tree these tests import scorekit from: the other processes too
WAIT = 60.0  # seconds for a process that imports prometheus-client and counts a few things; only a hang takes it

# A front end on row ``argv[2]`` of the board at ``argv[1]``: counts one /score request (200, 0.25 s) and one
# batch of ``argv[3]`` items for model m; with "render", then prints the scrape. Its live gauges: its board's load,
# and model m's queue as ``ModelGauge(m, 3, 30, 1)``, which a model's engine reads over every front end too.
FRONT_END = """
import os, sys
from pathlib import Path
from scorekit.load import Board, LoadCounter
from scorekit.metrics import Metrics, ModelGauge
board = Board.attach(Path(sys.argv[1]), int(sys.argv[2]))
load = LoadCounter(board)
load.enter(); load.enter_route("/score")  # left in flight: the gauge reads it from the board
metrics = Metrics(load, lambda: [ModelGauge("m", 3, 30, 1)], processes=Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
metrics.observe_request("/score", 200, 0.25)
metrics.model("m").batch(int(sys.argv[3]), 64, 0.5)
if sys.argv[4:] == ["render"]:
    sys.stdout.write(metrics.render().decode())
"""


def front_end(board: Path, row: int, items: int, *then: str, processes: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FRONT_END, str(board), str(row), str(items), *then],
        cwd=ROOT,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(processes)},
        stdout=subprocess.PIPE,
        text=True,
    )


def samples(scrape: str, name: str) -> list[str]:
    """The sample lines of the series ``name`` (with its labels, as exposed), each with its value."""
    return [line for line in scrape.splitlines() if line.rsplit(" ", 1)[0] == name]


def test_a_scrape_sums_every_process_and_reads_the_live_gauges_once(tmp_path: Path) -> None:
    """Two front ends count a request and a batch each and exit; a third counts its own and renders: the counters
    and histograms are the three processes' sums, each series once, and each live gauge appears once, with the
    board's count over the three (one request each still in flight), not three times."""
    processes = tmp_path / "prometheus"
    processes.mkdir()
    board = Board.create(tmp_path / "load.board")
    try:
        gone = [front_end(board.path, row, row + 1, processes=processes) for row in (0, 1)]
        assert [process.wait(WAIT) for process in gone] == [0, 0]
        scraped = front_end(board.path, 2, 4, "render", processes=processes)
        scrape, _ = scraped.communicate(timeout=WAIT)
        assert scraped.returncode == 0
    finally:
        board.close()
    expected = {
        'scorekit_requests_total{route="/score",status="200"}': "3.0",
        'scorekit_request_duration_seconds_count{route="/score"}': "3.0",
        'scorekit_request_duration_seconds_sum{route="/score"}': "0.75",
        'scorekit_batch_size_count{model="m"}': "3.0",
        'scorekit_batch_size_sum{model="m"}': "7.0",  # 1 + 2 + 4 items
        'scorekit_inference_duration_seconds_sum{model="m"}': "1.5",
        "scorekit_load": "3.0",
        'scorekit_route_load{route="/score"}': "3.0",
        'scorekit_queue_depth{model="m"}': "3.0",
        'scorekit_queue_tokens{model="m"}': "30.0",
        'scorekit_model_requests{model="m"}': "1.0",
    }
    assert {name: samples(scrape, name) for name in expected} == {
        name: [f"{name} {value}"] for name, value in expected.items()
    }, scrape


def test_metrics_over_processes_refuse_a_prometheus_client_that_is_not_writing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without PROMETHEUS_MULTIPROC_DIR, with it naming another directory, or with it set only after
    prometheus-client was imported (its counters then stay in the process), ``processes`` is a ValueError that
    says so: a scrape would otherwise answer one front end's share as the server's."""
    processes, other = tmp_path / "prometheus", tmp_path / "other"
    processes.mkdir()
    other.mkdir()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR set to the directory"):
        Metrics(LoadCounter(), lambda: [], processes=processes)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(other))
    with pytest.raises(ValueError, match="PROMETHEUS_MULTIPROC_DIR set to the directory"):
        Metrics(LoadCounter(), lambda: [], processes=processes)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(processes))
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)  # as imported without it: one process's values
    with pytest.raises(ValueError, match="imported before PROMETHEUS_MULTIPROC_DIR was set"):
        Metrics(LoadCounter(), lambda: [], processes=processes)
    assert os.listdir(processes) == []  # nothing was counted there
