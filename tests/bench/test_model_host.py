"""``python -m bench.model_host --smoke`` runs end to end against three real servers and writes its JSON.

No figure is judged (a smoke run on a shared machine measures nothing); only that every mode was measured,
with every key present and every ratio finite and positive.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.model_host import KEYS, MODES
from tests.bench.smoke import positive, run_smoke


@pytest.mark.e2e
def test_the_smoke_run_compares_every_mode(tmp_path: Path) -> None:
    stdout = run_smoke("bench.model_host", tmp_path)
    assert "coupling" in stdout  # the table was printed

    result = json.loads((tmp_path / "model-host.json").read_text())
    assert set(result["modes"]) == set(MODES)
    for mode, figures in result["modes"].items():
        for key in KEYS:  # other jobs may have kept no core busy
            ok = math.isfinite(figures[key]) and figures[key] >= 0 if key == "other_cores" else positive(figures[key])
            assert ok, (mode, key, figures[key])
    assert set(result["over_in_process"]) == set(MODES) - {"in_process"}
    assert all(positive(ratio) for ratio in result["over_in_process"].values())
    for point in (r[mode] for r in result["rounds"] for mode in MODES):
        assert set(point["statuses"]) == {"200"}, point["statuses"]
        assert positive(point["served_s_per_item"]) and positive(point["raw_s_per_item"]), point
