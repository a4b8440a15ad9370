"""``python -m bench.tracing``: the smoke run measures every variant in both forms, and the span sink saw exactly
the traced requests' spans; a ``--baseline`` tree's package is the one its processes import.

No figure is judged (a smoke run on a shared machine measures nothing); only that every variant was measured, every
ratio is finite and positive, and the traces went where the variants say: each request of ``on`` exported its span,
none of ``sampled_out`` or ``off``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.servers import ROOT, child_env
from bench.tracing import HTTP_REQUESTS, SMOKE, Sink, baseline_path, origin, python, span_name, variant_env
from tests.bench.smoke import positive, run_smoke

VARIANTS = ("off", "on", "sampled_out")


@pytest.mark.e2e
def test_the_smoke_run_measures_every_variant_and_exports_each_traced_request(tmp_path: Path) -> None:
    stdout = run_smoke("bench.tracing", tmp_path)
    assert "on/off" in stdout  # the table was printed

    result = json.loads((tmp_path / "tracing.json").read_text())
    assert set(result["variants"]) == set(VARIANTS)
    assert result["packages"] == dict.fromkeys(VARIANTS, "checkout")
    forms = {"http": set(HTTP_REQUESTS), "inproc": {name for name, _ in SMOKE.inproc_requests}}
    for form, requests in forms.items():
        assert set(result[form]) == requests, form
        for request, figures in result[form].items():
            assert all(positive(figures["best_cpu_us"][v]) for v in VARIANTS), (form, request, figures)
            assert set(figures["ratios"]) == {"on/off", "sampled_out/off"}
            assert all(positive(ratio) for ratio in figures["ratios"].values()), (form, request, figures)
    inproc = result["inproc"]["models"]
    assert positive(inproc["mean_export_us"]["on"])  # the exporter's thread and the last flush worked
    # Every request the on variant answered had its span exported (none dropped), and the others exported none.
    roots = {name: count for name, count in result["sink"]["spans"].items() if " " in name}
    assert roots == result["answered_by_on"], (roots, result["answered_by_on"])
    assert set(roots) == {span_name(request) for request in ("models", *HTTP_REQUESTS)}


def test_a_baseline_tree_shadows_this_checkouts_package_and_nothing_else(tmp_path: Path) -> None:
    tree = tmp_path / "pre_tracing"
    (tree / "scorekit").mkdir(parents=True)
    (tree / "scorekit" / "__init__.py").write_text("")
    (tree / "scorekit" / "app.py").write_text("")
    env = variant_env("baseline", Sink("http/protobuf"), baseline_path(tree, tmp_path / "work"))
    assert not any(name.startswith("OTEL_") for name in env)
    code = "import bench, scorekit; print(scorekit.__file__); print(bench.__file__)"
    done = subprocess.run(
        python("-c", code), cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60, check=True
    )
    package, bench = done.stdout.split()
    assert Path(package).resolve() == (tree / "scorekit" / "__init__.py").resolve()
    assert Path(bench).resolve() == ROOT / "bench" / "__init__.py"


def test_a_variant_that_imported_the_other_tree_stops_the_run(tmp_path: Path) -> None:
    """Measuring one tree twice would read as "unchanged when off" whatever the code did."""
    checkout = str((ROOT / "scorekit").resolve())
    (tmp_path / "scorekit").mkdir()
    assert origin("off", checkout, tmp_path) == "checkout"
    assert origin("baseline", str(tmp_path / "scorekit"), tmp_path) == "baseline"
    with pytest.raises(RuntimeError, match="the baseline worker imported scorekit from"):
        origin("baseline", checkout, tmp_path)
    with pytest.raises(RuntimeError, match="the on worker imported scorekit from"):
        origin("on", str(tmp_path / "scorekit"), tmp_path)


def test_a_baseline_without_scorekit_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=re.escape("no scorekit/app.py there")):
        baseline_path(tmp_path, tmp_path / "work")


def test_the_traced_variants_name_their_sampler_and_the_sink() -> None:
    sink = Sink("grpc")
    sink.endpoint = "http://127.0.0.1:4317"
    on, out, off = (variant_env(v, sink, None) for v in ("on", "sampled_out", "off"))
    assert on["OTEL_TRACES_SAMPLER"] == "always_on" and out["OTEL_TRACES_SAMPLER"] == "always_off"
    for env in (on, out):
        assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == sink.endpoint
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"
    assert off == {}
