"""Cohere's /v2/embed through the real Cohere SDK (``ClientV2.embed``) and raw bodies: the float vectors against
sentence-transformers, each quantized type against sentence-transformers' ``quantize_embeddings`` with the
per-vector range docs/api.md states (and that rule written out here), base64, Cohere's truncate, usage; what is
refused, by name; and that its work is batched, counted in /load, limited and cancelled like the rest."""

from __future__ import annotations

import base64
import struct
from typing import Any

import cohere
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.util.quantization import quantize_embeddings

from scorekit.app import ScorekitApp, create_app
from scorekit.models import default_model_path
from scorekit.settings import Settings
from tests.e2e.texts import many_docs
from tests.live import Live, serve, settled_stats, wait_for

pytestmark = pytest.mark.e2e

TEXTS = ["what is the capital of france", "paris is the capital and largest city of france", "bees make honey", ""]
ATOL = 1e-5
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
LONG = "the quick brown fox jumps over the lazy dog " * 80  # about 720 tokens, over MiniLM's 256


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(default_model_path(), device="cpu")


def _client(live: Live) -> cohere.ClientV2:
    return cohere.ClientV2(base_url=live.url, api_key="x", timeout=60)


def _per_vector(vectors: np.ndarray, precision: str) -> list[list[int]]:
    """sentence-transformers' quantize_embeddings, each vector calibrated on its own range [-max|v|, max|v|]."""
    rows = []
    for vector in vectors:
        largest = np.abs(vector).max()
        ranges = np.array([[-largest] * len(vector), [largest] * len(vector)])
        rows.append(quantize_embeddings(vector[None], precision, ranges=ranges)[0].tolist())
    return rows


def test_the_sdk_gets_every_embedding_type_as_sentence_transformers_computes_it(
    minilm: Live, reference: SentenceTransformer
) -> None:
    response = _client(minilm).embed(
        model=MODEL, input_type="search_document", texts=TEXTS, embedding_types=TYPES, priority=1
    )
    got = response.embeddings
    assert got.float_ is not None and got.base64 is not None
    floats = np.array(got.float_, dtype=np.float32)
    torch.testing.assert_close(torch.from_numpy(floats), torch.from_numpy(reference.encode(TEXTS)), rtol=0, atol=ATOL)
    # The quantized types are made from the float answer of the same request: exactly as the reference makes them.
    for precision in ("int8", "uint8", "binary", "ubinary"):
        assert getattr(got, precision) == _per_vector(floats, precision), precision
    assert all(len(row) == 384 // 8 for row in got.binary or [])
    decoded = [list(struct.unpack("<384f", base64.b64decode(text))) for text in got.base64]
    assert decoded == floats.tolist()
    assert response.texts == TEXTS and response.id.startswith("embd-")
    assert response.response_type == "embeddings_by_type"
    assert response.meta is not None and response.meta.api_version is not None
    assert response.meta.api_version.version == "2"
    tokens = sum(len(reference.tokenizer(text)["input_ids"]) for text in TEXTS)
    assert response.meta.billed_units is not None and response.meta.billed_units.input_tokens == tokens


def test_int8_and_uint8_follow_the_rule_written_out(minilm: Live) -> None:
    """docs/api.md's rule with no library: 255 equal steps of [-m, m], m the vector's largest absolute value,
    floor, int8 = uint8 - 128."""
    _, answer = minilm.json("POST", "/v2/embed", {"texts": TEXTS[:1], "embedding_types": ["float", "int8", "uint8"]})
    vector = np.array(answer["embeddings"]["float"][0], dtype=np.float32)
    largest = np.float32(np.abs(vector).max())
    step = np.float32(largest + largest) / np.float32(255)
    uint8 = [int(min(max(np.floor((value + largest) / step), 0), 255)) for value in vector]
    assert answer["embeddings"]["uint8"][0] == uint8
    assert answer["embeddings"]["int8"][0] == [value - 128 for value in uint8]
    assert min(uint8) >= 0 and max(uint8) <= 255 and len(set(uint8)) > 100  # the steps are fine enough to tell apart


def test_binary_packs_the_signs_eight_to_a_byte_highest_bit_first(minilm: Live) -> None:
    """12 dimensions: two bytes, the second padded with zero bits (numpy.packbits)."""
    body = {"texts": TEXTS[:2], "output_dimension": 12, "embedding_types": ["float", "binary", "ubinary"]}
    _, answer = minilm.json("POST", "/v2/embed", body)
    for row, vector in enumerate(answer["embeddings"]["float"]):
        bits = "".join("1" if value > 0 else "0" for value in vector).ljust(16, "0")
        expected = [int(bits[:8], 2), int(bits[8:], 2)]
        assert answer["embeddings"]["ubinary"][row] == expected
        assert answer["embeddings"]["binary"][row] == [value - 128 for value in expected]


def test_only_the_types_asked_for_are_answered_and_float_by_default(minilm: Live) -> None:
    _, default = minilm.json("POST", "/v2/embed", {"texts": TEXTS[:1]})
    assert list(default["embeddings"]) == ["float"]
    _, two = minilm.json("POST", "/v2/embed", {"texts": TEXTS[:1], "embedding_types": ["ubinary", "int8", "int8"]})
    assert sorted(two["embeddings"]) == ["int8", "ubinary"]
    inputs = [{"content": [{"type": "text", "text": text}]} for text in TEXTS]
    _, by_inputs = minilm.json("POST", "/v2/embed", {"inputs": inputs})
    _, by_texts = minilm.json("POST", "/v2/embed", {"texts": TEXTS})
    assert by_inputs["texts"] == TEXTS
    torch.testing.assert_close(
        torch.tensor(by_inputs["embeddings"]["float"]), torch.tensor(by_texts["embeddings"]["float"]), rtol=0, atol=ATOL
    )


def test_truncate_cuts_the_end_by_default_the_start_when_asked_and_none_refuses(
    minilm: Live, reference: SentenceTransformer
) -> None:
    client = _client(minilm)
    end = client.embed(model=MODEL, input_type="search_query", texts=["short", LONG]).embeddings.float_
    start = client.embed(model=MODEL, input_type="search_query", texts=["short", LONG], truncate="START").embeddings
    assert end is not None and start.float_ is not None
    torch.testing.assert_close(
        torch.tensor(end), torch.from_numpy(reference.encode(["short", LONG])), rtol=0, atol=ATOL
    )
    _, left = minilm.json(
        "POST", "/v1/embeddings", {"input": LONG, "truncate_prompt_tokens": -1, "truncation_side": "left"}
    )
    torch.testing.assert_close(
        torch.tensor(start.float_[1]), torch.tensor(left["data"][0]["embedding"]), rtol=0, atol=ATOL
    )
    status, answer = minilm.json("POST", "/v2/embed", {"texts": ["short", LONG], "truncate": "NONE"})
    assert status == 400 and answer["error"]["param"] == "input_tokens"
    assert answer["error"]["message"].startswith("texts[1] has ")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"texts": ["x"], "input_type": "image"}, "input_type"),
        ({"texts": ["x"], "images": ["data:image/png;base64,AAAA"]}, "images"),
        ({"texts": ["x"], "inputs": [{"content": [{"type": "text", "text": "x"}]}]}, "texts"),
        ({}, "texts"),
        ({"texts": []}, "texts"),
        ({"inputs": []}, "inputs"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "inputs[0].content[0]"),
        (
            {"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
            "inputs[0].content",
        ),
        ({"texts": ["x"], "embedding_types": []}, "body.embedding_types"),
        ({"texts": ["x"], "embedding_types": ["int4"]}, "body.embedding_types"),
        ({"texts": ["x"], "truncate": "MIDDLE"}, "body.truncate"),
        ({"texts": ["x"], "input_type": "search"}, "body.input_type"),
        ({"texts": ["x"], "max_tokens": 10}, "max_tokens"),
        ({"texts": ["x"], "output_dimension": 385}, "output_dimension"),
        ({"texts": "x"}, "body.texts"),
    ],
)
def test_bad_v2_embed_requests_are_a_400_naming_the_field(minilm: Live, body: dict[str, Any], param: str) -> None:
    status, answer = minilm.json("POST", "/v2/embed", body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["code"] == 400


def test_the_sdk_sees_a_refusal_as_its_api_error(minilm: Live) -> None:
    with pytest.raises(cohere.core.ApiError) as raised:
        _client(minilm).embed(model=MODEL, input_type="search_query", texts=["x"], output_dimension=0)
    assert raised.value.status_code == 400
    assert "output_dimension must be between 1 and 384" in str(raised.value.body)


def test_a_cross_encoder_cannot_embed(cross_encoder: Live) -> None:
    status, answer = cross_encoder.json("POST", "/v2/embed", {"texts": ["x"]})
    assert status == 404 and "Embed API" in answer["error"]["message"]


def test_max_items_per_request_counts_texts() -> None:
    with serve(create_app(Settings(max_items_per_request=3))) as live:
        status, _ = live.json("POST", "/v2/embed", {"texts": ["a", "b", "c"]})
        assert status == 200
        status, answer = live.json("POST", "/v2/embed", {"texts": ["a", "b", "c", "d"]})
        assert status == 400 and answer["error"]["param"] == "texts", answer


def test_a_large_v2_embed_is_batched_counted_in_load_and_cancelled_when_its_client_leaves(
    small_batches: tuple[ScorekitApp, Live],
) -> None:
    app, live = small_batches
    engine = app.engine
    assert engine is not None
    batch_size = app.settings.models[0].engine.max_batch_size
    start = engine.snapshot().worker
    sock = live.send_json("/v2/embed", {"texts": many_docs(2000), "embedding_types": ["int8"]})
    assert wait_for(lambda: engine.snapshot().worker.items >= start.items + 3 * batch_size, timeout=30)
    assert live.load() == 1
    sock.close()
    assert live.wait_load(0) == 0
    end = settled_stats(app)
    assert end.items_of_cancelled_jobs - start.items_of_cancelled_jobs <= batch_size
    assert end.items - start.items < 2000
    batches = end.batches - start.batches
    assert max(list(end.recent_batch_sizes)[-batches:]) > 1  # inputs share batches
    status, answer = live.json("POST", "/v2/embed", {"texts": ["still serving"], "embedding_types": ["binary"]})
    assert status == 200 and len(answer["embeddings"]["binary"][0]) == 48
