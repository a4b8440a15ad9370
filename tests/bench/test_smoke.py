"""The benchmark harness runs end to end at toy sizes and writes the JSON that docs/benchmarks.md reports.

No figure is judged here (a smoke run on a shared machine measures nothing); only that every scenario
ran against real servers and produced its keys with finite, positive ratios.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.bench.smoke import positive, run_smoke

# scenario -> the keys its JSON must hold, and which of them are ratios that must be finite and > 0.
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "efficiency": ({"points", "sweep", "best_batch_size", "ratio", "ratio_wall"}, {"ratio", "ratio_wall"}),
    "batching": ({"naive_points", "scorekit_rps", "naive_rps", "gain", "one_document"}, {"gain", "gain_wall"}),
    "overhead": (
        {"http_rps", "inproc_us_per_request", "middleware_cost", "scorekit_over_fastapi"},
        {"scorekit_over_fastapi", "scorekit_over_starlette", "inproc_scorekit_over_fastapi"},
    ),
    "disconnect": (
        {"trials", "wasted_items", "batch_items", "wasted_batches", "wasted_items_per_batch"},
        {"batch_items"},
    ),
    "fairness": ({"default", "ratio", "two_keys"}, {"ratio"}),
    "growth": ({"points", "time_per_doc_ratio", "memory_growth_ratio"}, {"time_per_doc_ratio"}),
    "llm_reranker": (
        {"raw", "server_items_per_cpu_s", "ratio", "prefix"},
        {"ratio", "prefix_speedup_small", "prefix_speedup_large"},
    ),
}


@pytest.mark.e2e
def test_the_smoke_run_writes_every_scenario(tmp_path: Path) -> None:
    stdout = run_smoke("bench", tmp_path)
    assert "figure" in stdout  # the table was printed

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["profile"] == "smoke"
    assert {row["scenario"] for row in summary["targets"]} == set(EXPECTED)
    for scenario, (keys, ratios) in EXPECTED.items():
        result = json.loads((tmp_path / f"{scenario}.json").read_text())
        assert keys <= result.keys(), (scenario, keys - result.keys())
        for key in ratios:
            assert positive(result[key]), (scenario, key, result[key])

    efficiency = json.loads((tmp_path / "efficiency.json").read_text())
    assert all(positive(point["server_items_per_s"]) for point in efficiency["points"])
    fairness = json.loads((tmp_path / "fairness.json").read_text())["default"]
    assert 0 < fairness["big_alone_cores"] <= fairness["cores"] + 0.5, fairness  # read from the server's own clock
    # Room may be anything up to 1 on a loaded machine (the probes' own CPU can fill the cores), never missing.
    assert all(math.isfinite(fairness[key]) and fairness[key] <= 1 for key in ("pace_room", "pace_room_at_3x"))
    assert positive(fairness["probe_cost"]["server_cpu_s"]), fairness
    disconnect = json.loads((tmp_path / "disconnect.json").read_text())
    assert disconnect["wasted_batches"] >= 0
    for trial in disconnect["trials"]:  # every item of the big request either ran or was dropped
        assert trial["accounted_items"] == disconnect["items"], trial
        assert float(trial["wasted_batches"]).is_integer(), trial  # a count of batches, not a ratio of items
    assert {path.name for path in tmp_path.glob("*.png")} == {"throughput.png", "latency.png", "growth.png"}
