"""/generative_scoring on a tiny random causal LM, against a direct transformers forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.live import Live

QUERY = "Is the sky blue? Answer yes or no:"
ITEMS = ["the sky", "a much longer item with quite a few more words in it", "no"]
LABELS = [100, 200, 300]


@pytest.fixture(scope="module")
def reference(causal_lm_dir: Path) -> tuple[object, object]:
    model = AutoModelForCausalLM.from_pretrained(causal_lm_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(causal_lm_dir)


def expected_probabilities(reference: tuple[object, object], item_first: bool, softmax: bool) -> list[list[float]]:
    model, tokenizer = reference
    query_ids = tokenizer(QUERY)["input_ids"]  # type: ignore[operator]
    rows = []
    for item in ITEMS:
        item_ids = tokenizer(item, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        ids = item_ids + query_ids if item_first else query_ids + item_ids
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].float()  # type: ignore[operator]
        chosen = logits[LABELS]
        probs = torch.softmax(chosen, -1) if softmax else torch.softmax(logits, -1)[LABELS]
        rows.append(probs.tolist())
    return rows


@pytest.mark.parametrize("item_first", [False, True])
@pytest.mark.parametrize("apply_softmax", [True, False])
def test_probabilities_match_a_direct_forward(
    causal_lm: Live, reference: tuple[object, object], item_first: bool, apply_softmax: bool
) -> None:
    payload = {
        "query": QUERY,
        "items": ITEMS,
        "label_token_ids": LABELS,
        "item_first": item_first,
        "apply_softmax": apply_softmax,
    }
    status, body = causal_lm.json("POST", "/generative_scoring", payload)
    assert status == 200, body
    expected = expected_probabilities(reference, item_first, apply_softmax)
    for row, data in zip(expected, body["data"], strict=True):
        assert data["scores"] == pytest.approx(row, abs=1e-5)
        assert data["score"] == pytest.approx(row[0], abs=1e-5)
    assert body["id"].startswith("generative-scoring-") and body["object"] == "list"
    usage = body["usage"]
    assert usage["completion_tokens"] == len(ITEMS)
    assert usage["total_tokens"] == usage["prompt_tokens"] + len(ITEMS)


def test_token_id_inputs_are_accepted(causal_lm: Live) -> None:
    status, body = causal_lm.json(
        "POST",
        "/generative_scoring",
        {"query": [101, 2003], "items": [[2054], [2129, 2003]], "label_token_ids": [1]},
    )
    assert status == 200 and len(body["data"]) == 2
    assert body["usage"]["prompt_tokens"] == 3 + 4


@pytest.mark.parametrize(
    ("payload", "param", "message"),
    [
        ({"query": "q", "items": [], "label_token_ids": [1]}, "items", "at least one item"),
        ({"query": "q", "items": ["a"], "label_token_ids": []}, "label_token_ids", "at least one token ID"),
        (
            {"query": "q", "items": ["a"], "label_token_ids": [10**9]},
            "label_token_ids",
            "out of vocabulary range",
        ),
        ({"query": "q", "items": ["a", [1]], "label_token_ids": [1]}, "items", "not a mix"),
        ({"query": "q", "items": ["a"]}, None, "missing required field"),  # vLLM: a ValueError, no param
        ({"query": [10**9], "items": [[1]], "label_token_ids": [1]}, "query", "vocabulary range"),
    ],
)
def test_bad_generative_requests_are_400(
    causal_lm: Live, payload: dict[str, object], param: str | None, message: str
) -> None:
    status, body = causal_lm.json("POST", "/generative_scoring", payload)
    assert status == 400 and body["error"]["param"] == param
    assert message in body["error"]["message"]


def test_score_on_a_causal_lm_is_404_as_vllm(causal_lm: Live) -> None:
    status, body = causal_lm.json("POST", "/score", {"queries": "a", "documents": ["b"]})
    assert status == 404
    assert body["error"] == {
        "message": "The model does not support the Score API.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
