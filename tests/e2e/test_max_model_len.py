"""``max_model_len`` caps a model's longest input below its own (vLLM's ``--max-model-len``), and
``trust_remote_code`` reaches transformers: over a real server, on the tiny cross-encoder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scorekit.app import create_app
from scorekit.models import load_backend
from scorekit.settings import Settings
from tests.live import Live, serve
from tests.tiny_models import MAX_POSITIONS

CAP = 16
QUERY = "a short query"
# About 24 tokens beside the query: far below the model's own 128, over the cap of 16.
DOCUMENT = "the quick brown fox jumps over the lazy dog again and again near the quiet river bank today"


@pytest.fixture(scope="module")
def capped(cross_encoder_dir: Path) -> Iterator[Live]:
    settings = Settings.for_model(str(cross_encoder_dir), name="tiny-ce-capped", max_model_len=CAP)
    with serve(create_app(settings)) as live:
        yield live


def rerank(live: Live, **extra: object) -> tuple[int, dict[str, object]]:
    status, body = live.json("POST", "/rerank", {"query": QUERY, "documents": [DOCUMENT], **extra})
    return status, body


def test_the_model_card_says_the_cap(capped: Live) -> None:
    status, body = capped.json("GET", "/v1/models")
    assert status == 200
    assert body["data"][0]["max_model_len"] == CAP


def test_an_input_over_the_cap_is_vllms_context_length_error(capped: Live, cross_encoder: Live) -> None:
    status, _ = rerank(cross_encoder)
    assert status == 200  # the model itself takes it
    status, body = rerank(capped)
    assert status == 400, body
    assert body["error"]["param"] == "input_tokens"
    assert f"maximum length is {CAP} tokens" in body["error"]["message"]


def test_truncation_is_bounded_by_the_cap_and_scores_as_uncapped(capped: Live, cross_encoder: Live) -> None:
    status, body = rerank(capped, truncate_prompt_tokens=CAP + 1)
    assert status == 400
    assert body["error"]["param"] == "truncate_prompt_tokens"
    status, cut = rerank(capped, truncate_prompt_tokens=CAP)
    assert status == 200, cut
    _, reference = rerank(cross_encoder, truncate_prompt_tokens=CAP)
    assert cut["usage"]["prompt_tokens"] == reference["usage"]["prompt_tokens"] == CAP
    assert cut["results"][0]["relevance_score"] == pytest.approx(reference["results"][0]["relevance_score"], abs=1e-5)


def test_a_cap_above_the_models_own_is_refused_and_trust_remote_code_loads(cross_encoder_dir: Path) -> None:
    over = rf"len \({MAX_POSITIONS + 1}\) is greater than the derived max_model_len \(max_length={MAX_POSITIONS} of"
    with pytest.raises(ValueError, match=over):
        load_backend(str(cross_encoder_dir), max_model_len=MAX_POSITIONS + 1)
    backend = load_backend(str(cross_encoder_dir), max_model_len=MAX_POSITIONS, trust_remote_code=True)
    assert backend.max_length == MAX_POSITIONS
