"""`scorekit serve` with `--model` repeated: every model loads before the server starts, each under its name."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.hardening.process import scorekit_serve


def test_serve_two_models_by_name(tmp_path: Path, cross_encoder_dir: Path) -> None:
    flags = ("--model", f"first={cross_encoder_dir}", "--model", str(cross_encoder_dir))
    with scorekit_serve(tmp_path, *flags) as (proc, live, log):
        status, listed = live.json("GET", "/v1/models")
        assert status == 200
        assert [card["id"] for card in listed["data"]] == ["first", str(cross_encoder_dir)]
        answers = {}
        for model in ("first", str(cross_encoder_dir), None):
            body = {"query": "q", "documents": ["a", "b"], **({"model": model} if model else {})}
            status, answer = live.json("POST", "/rerank", body)
            assert status == 200, answer
            answers[model] = answer
        assert answers[None]["model"] == "first"  # no model: the first one
        # The same weights under two names: the same scores (to float tolerance), from two engines.
        scores = {m: [r["relevance_score"] for r in a["results"]] for m, a in answers.items()}
        assert scores[str(cross_encoder_dir)] == pytest.approx(scores["first"], abs=1e-6)
        assert scores[None] == pytest.approx(scores["first"], abs=1e-6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    text = log.read_text()
    assert text.count("(cross-encoder) on cpu") == 2
    assert "as 'first'" in text and f"as {str(cross_encoder_dir)!r}" in text
