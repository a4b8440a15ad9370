"""bench.report's printed table: its columns line up whatever a figure's label, and the disconnect figure is a
count of batches, judged against one batch."""

from __future__ import annotations

from typing import Any

from bench.report import evaluate, table

DISCONNECT = "batches run after a disconnect"


def _results(wasted_batches: float) -> dict[str, Any]:
    return {
        "disconnect": {"wasted_batches": wasted_batches, "wasted_items_per_batch": 1.23},
        "fairness": {
            "ratio": 1.2,
            "default": {"big_pace_ratio": 0.55, "pace_room_at_3x": 1.0},
            "two_keys": {"loaded_ratio_p99": 1.3},
        },
    }


def test_the_verdicts_line_up_under_their_heading_whatever_the_labels() -> None:
    rows = evaluate(_results(1))
    header, _, *lines = table(rows).splitlines()
    assert max(len(row["figure"]) for row in rows) > 42  # longer than the column the table used to fix
    for line, row in zip(lines, rows, strict=True):
        verdict = "info" if row["target"] == "(info)" else ("MET" if row["met"] else "MISSED")
        assert line.startswith(row["figure"])
        assert line.rindex(verdict) == header.index("result"), (header, line)


def test_the_disconnect_figure_is_a_count_of_batches() -> None:
    assert {row["figure"]: row["met"] for row in evaluate(_results(1))}[DISCONNECT]
    assert not {row["figure"]: row["met"] for row in evaluate(_results(2))}[DISCONNECT]
    line = next(line for line in table(evaluate(_results(1))).splitlines() if line.startswith(DISCONNECT))
    assert line[len(DISCONNECT) :].split()[0] == "1", line  # a bare count, not a ratio such as "1.00x"
