"""Identical inputs in one request run once and share one result (issue: ties broke on AVX-512 CPUs).

Two rows of one batched forward are not bit-identical on every CPU, so "ties keep input order" holds only
because each distinct text (bi-encoder), pair (cross-encoder) or item (generative) runs once per request.
The worker's item counter proves it ran once; the scores must be equal as floats, not approximately.
Usage still counts what vLLM counts: every rendered pair, every item, the query once plus every document.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from scorekit.app import ScorekitApp, create_app
from scorekit.models import default_model_path
from scorekit.settings import Settings
from tests.e2e.texts import QUERY, many_docs
from tests.live import Live, serve

SAME = "The capital of France is Paris."
OTHER = "Cross-encoder models are neat, and this sentence is a good deal longer than the others."


@pytest.fixture(scope="module")
def cross_encoder_app(cross_encoder_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(str(cross_encoder_dir)))
    with serve(app) as live:
        yield app, live


@pytest.fixture(scope="module")
def causal_lm_app(causal_lm_dir: Path) -> Iterator[tuple[ScorekitApp, Live]]:
    app = create_app(Settings.for_model(str(causal_lm_dir)))
    with serve(app) as live:
        yield app, live


def _items_run(app: ScorekitApp) -> int:
    assert app.engine is not None
    return app.engine.snapshot().worker.items


def test_bi_encoder_identical_documents_share_one_score_and_tie_in_input_order(
    minilm_app: ScorekitApp, minilm: Live
) -> None:
    documents = [SAME, OTHER, SAME, SAME, OTHER]
    before = _items_run(minilm_app)
    status, body = minilm.json("POST", "/rerank", {"query": QUERY, "documents": documents})
    assert status == 200, body
    assert _items_run(minilm_app) - before == 3  # the query and two distinct documents
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert scores[0] == scores[2] == scores[3] and scores[1] == scores[4]  # exact: identical inputs in one request
    same_first = [r["index"] for r in body["results"] if r["index"] in (0, 2, 3)]
    assert same_first == [0, 2, 3]
    assert [r["index"] for r in body["results"] if r["index"] in (1, 4)] == [1, 4]


def test_bi_encoder_usage_counts_every_text_as_vllm_does(minilm: Live) -> None:
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokens = {text: len(tokenizer(text)["input_ids"]) for text in (QUERY, SAME, OTHER)}
    _, one_to_n = minilm.json("POST", "/score", {"queries": QUERY, "documents": [SAME, SAME, OTHER]})
    assert one_to_n["usage"]["prompt_tokens"] == tokens[QUERY] + 2 * tokens[SAME] + tokens[OTHER]
    _, n_to_n = minilm.json("POST", "/score", {"queries": [QUERY, QUERY], "documents": [SAME, SAME]})
    assert n_to_n["usage"]["prompt_tokens"] == 2 * tokens[QUERY] + 2 * tokens[SAME]
    assert n_to_n["data"][0]["score"] == n_to_n["data"][1]["score"]  # exact: identical inputs in one request


def test_cross_encoder_identical_pairs_run_once(cross_encoder_app: tuple[ScorekitApp, Live]) -> None:
    app, live = cross_encoder_app
    before = _items_run(app)
    payload = {"queries": ["q", "q", "q", "other q"], "documents": [SAME, OTHER, SAME, SAME]}
    status, body = live.json("POST", "/score", payload)
    assert status == 200, body
    assert _items_run(app) - before == 3  # (q, SAME) once, (q, OTHER), (other q, SAME)
    scores = [d["score"] for d in body["data"]]
    assert scores[0] == scores[2]  # exact: identical inputs in one request
    tokenizer = AutoTokenizer.from_pretrained(app.settings.models[0].path)
    pairs = zip(payload["queries"], payload["documents"], strict=True)
    expected = sum(len(tokenizer(q, d)["input_ids"]) for q, d in pairs)
    assert body["usage"]["prompt_tokens"] == expected  # every rendered pair, repeats included


def test_cross_encoder_rerank_ties_keep_input_order(cross_encoder_app: tuple[ScorekitApp, Live]) -> None:
    _, live = cross_encoder_app
    _, body = live.json("POST", "/rerank", {"query": QUERY, "documents": [SAME, SAME, SAME]})
    assert [r["index"] for r in body["results"]] == [0, 1, 2]
    assert len({r["relevance_score"] for r in body["results"]}) == 1


def test_generative_identical_items_run_once(causal_lm_app: tuple[ScorekitApp, Live]) -> None:
    app, live = causal_lm_app
    before = _items_run(app)
    payload = {"query": "Is it?", "items": ["yes it is", [7, 8], "yes it is", [7, 8]], "label_token_ids": [5, 6]}
    status, body = live.json("POST", "/generative_scoring", payload)
    assert status == 400 and "not a mix" in body["error"]["message"]  # strings and ids never mix
    payload["items"] = ["yes it is", "no", "yes it is"]
    status, body = live.json("POST", "/generative_scoring", payload)
    assert status == 200, body
    assert _items_run(app) - before == 2
    assert body["data"][0]["scores"] == body["data"][2]["scores"]  # exact: identical inputs in one request
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 3  # every item's prompt counts, as in vLLM


def test_a_pairs_score_moves_less_than_1e_5_with_the_batch_it_lands_in(minilm: Live) -> None:
    """docs/api.md states the bound: padding to a batch's longest input moves a score by at most 1e-5
    (measured: under 2e-7 on MiniLM)."""
    _, alone = minilm.json("POST", "/score", {"queries": QUERY, "documents": [SAME]})
    crowd = [*many_docs(40), "a much longer document " * 20, SAME]
    _, crowded = minilm.json("POST", "/score", {"queries": QUERY, "documents": crowd})
    assert crowded["data"][-1]["score"] == pytest.approx(alone["data"][0]["score"], abs=1e-5)
