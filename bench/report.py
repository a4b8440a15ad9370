"""Targets, the printed table, and the JSON files: one per scenario plus summary.json.

Each target is judged on the form of its ratio that holds still on a shared machine (server CPU time
per unit of work, or a count of batches); the wall-clock form is shown beside it where there is one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Figure = Callable[[dict[str, Any]], float]


@dataclass(frozen=True, slots=True)
class Target:
    key: str  # the scenario
    label: str
    target: str
    figure: Figure
    met: Callable[[float], bool]
    wall: Figure | None = None
    unit: str = "x"


TARGETS = (
    Target(
        "efficiency",
        "efficiency c>=8: server / raw forward",
        ">= 0.90",
        lambda r: r["ratio"],
        lambda v: v >= 0.9,
        lambda r: r["ratio_wall"],
    ),
    Target(
        "batching",
        "batching gain: scorekit / naive",
        ">= 1.5x",
        lambda r: r["gain"],
        lambda v: v >= 1.5,
        lambda r: r["gain_wall"],
    ),
    Target(
        "batching",
        "batching gain, 1-document requests",
        "(info)",
        lambda r: r["one_document"]["gain"],
        lambda v: True,
        lambda r: r["one_document"]["gain_wall"],
    ),
    Target(
        "overhead",
        "lifecycle middleware cost",
        "<= 30%",
        lambda r: 100 * r["middleware_cost"],
        lambda v: v <= 30,
        lambda r: 100 * r["middleware_cost_wall"],
        "%",
    ),
    Target(
        "overhead",
        "lifecycle middleware cost, in process",
        "<= 30%",
        lambda r: 100 * r["inproc_middleware_cost"],
        lambda v: v <= 30,
        unit="%",
    ),
    Target(
        "overhead",
        "scorekit / FastAPI",
        "> 1.0x",
        lambda r: r["scorekit_over_fastapi"],
        lambda v: v > 1.0,
        lambda r: r["scorekit_over_fastapi_wall"],
    ),
    Target(
        "overhead",
        "scorekit / bare Starlette",
        "(info)",
        lambda r: r["scorekit_over_starlette"],
        lambda v: True,
        lambda r: r["scorekit_over_starlette_wall"],
    ),
    Target(
        "disconnect",
        "batches run after a disconnect",
        "<= 1 batch",
        lambda r: r["wasted_batches"],
        lambda v: v <= 1.0,
        unit="batches",
    ),
    Target(
        "disconnect",
        "items after disconnect / batch (info)",
        "(info)",
        lambda r: r["wasted_items_per_batch"],
        lambda v: True,
    ),
    Target(
        "fairness",
        "1-doc p99 beside a 5k-doc rerank / alone",
        "<= 3x",
        lambda r: r["ratio"],
        lambda v: v <= 3.0,
    ),
    Target(
        "fairness",
        "5k-doc rerank's pace beside the probes / alone",
        ">= 0.90",
        lambda r: r["default"]["big_pace_ratio"],
        lambda v: v >= 0.9,
    ),
    Target(
        "fairness",
        "quiet key's 1-doc p99 beside another key's flood / alone",
        "<= 1.5x",
        lambda r: r["two_keys"]["loaded_ratio_p99"],
        lambda v: v <= 1.5,
    ),
    Target(
        "fairness",
        "most pace the probes' CPU leaves at 3x (info)",
        "(info)",
        lambda r: r["default"]["pace_room_at_3x"],
        lambda v: True,
    ),
    Target(
        "growth",
        "time per doc, largest / next size",
        "<= 1.5x (linear)",
        lambda r: r["time_per_doc_ratio"],
        lambda v: v <= 1.5,
        lambda r: r["time_per_doc_ratio_wall"],
    ),
    Target(
        "growth",
        "peak RSS over baseline, largest / next",
        "<= 1.5x (flat)",
        lambda r: r["memory_growth_ratio"],
        lambda v: v <= 1.5,
    ),
    Target(
        "growth",
        "peak RSS per extra doc, 1k -> 10k docs",
        "<= 5 KiB",
        lambda r: r["kib_per_extra_document"],
        lambda v: v <= 5.0,
        unit="KiB",
    ),
    Target(
        "llm_reranker",
        "LLM reranker c=8: server / raw forward",
        ">= 0.90",
        lambda r: r["ratio"],
        lambda v: v >= 0.9,
    ),
    Target(
        "llm_reranker",
        "shared prefix speed-up, 1 x 16 docs",
        "(info)",
        lambda r: r["prefix_speedup_small"],
        lambda v: True,
    ),
    Target(
        "llm_reranker",
        "shared prefix speed-up, 1 x 128 docs",
        "(info)",
        lambda r: r["prefix_speedup_large"],
        lambda v: True,
    ),
    Target(
        "llm_reranker",
        "template head kept across requests, 1 x 16 docs",
        "(info)",
        lambda r: r["head_speedup_one"],
        lambda v: True,
    ),
    Target(
        "llm_reranker",
        "template head kept, 8 requests of 1 x 8 in a batch",
        "(info)",
        lambda r: r["head_speedup_batch"],
        lambda v: True,
    ),
    Target(
        "gpu",
        "GPU c=32: server / raw fp16 forward",
        ">= 0.90",
        lambda r: r["ratio"],
        lambda v: v >= 0.9,
    ),
)


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for target in TARGETS:
        if target.key not in results:
            continue
        result = results[target.key]
        value = target.figure(result)
        rows.append(
            {
                "scenario": target.key,
                "figure": target.label,
                "value": value,
                "wall": target.wall(result) if target.wall else None,
                "unit": target.unit,
                "target": target.target,
                "met": target.met(value),
            }
        )
    return rows


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "KiB":
        return f"{value:.1f} KiB"
    if unit == "batches":
        return f"{value:g}"
    return f"{value:.1f}%" if unit == "%" else f"{value:.2f}x"


def table(rows: list[dict[str, Any]]) -> str:
    width = max([len("figure"), *(len(row["figure"]) for row in rows)])
    lines = [f"{'figure':{width}} {'value':>8} {'wall':>8}  {'target':17} result", "-" * (width + 46)]
    for row in rows:
        verdict = "info" if row["target"] == "(info)" else ("MET" if row["met"] else "MISSED")
        value, wall = _fmt(row["value"], row["unit"]), _fmt(row["wall"], row["unit"])
        lines.append(f"{row['figure']:{width}} {value:>8} {wall:>8}  {row['target']:17} {verdict}")
    return "\n".join(lines)


def write(out: Path, results: dict[str, Any], summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        (out / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
