"""Embeddings through real clients on a real server: the OpenAI SDK on /v1/embeddings (floats and base64) and
httpx with TEI's body on /embed, against sentence-transformers computed independently; batching and a
client that leaves, counted on the worker's own counters; what is refused, in the error shape."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx
import openai
import pytest
import torch
from sentence_transformers import SentenceTransformer

from scorekit.app import ScorekitApp
from scorekit.models import default_model_path
from tests.e2e.texts import many_docs
from tests.live import Live, settled_stats, wait_for

pytestmark = pytest.mark.e2e

TEXTS = [
    "what is the capital of france",
    "paris is the capital and largest city of france",
    "bees make honey from nectar",
    "",
    "paris is the capital and largest city of france",  # a repeat: its own row, the same vector
]
ATOL = 1e-5


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(default_model_path(), device="cpu")


def _normalized(reference: SentenceTransformer, texts: list[str]) -> torch.Tensor:
    return torch.from_numpy(reference.encode(texts))


def _pooled(reference: SentenceTransformer, texts: list[str]) -> torch.Tensor:
    """The vector before MiniLM's Normalize module: the Transformer and Pooling modules run by hand."""
    assert type(reference[2]).__name__ == "Normalize"
    with torch.inference_mode():
        features = reference.tokenize(texts)
        pooled: torch.Tensor = reference[1](reference[0](features))["sentence_embedding"]
    return pooled


def _floats(encoded: object) -> list[float]:
    """OpenAI's base64: little-endian float32."""
    assert isinstance(encoded, str)
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def _openai(live: Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)


def test_the_openai_sdk_gets_sentence_transformers_embeddings_as_floats_and_base64(
    minilm: Live, reference: SentenceTransformer
) -> None:
    expected = _normalized(reference, TEXTS)
    client = _openai(minilm)
    as_floats = client.embeddings.create(model="", input=TEXTS, encoding_format="float", user="someone")
    # Without encoding_format the SDK asks for base64 and decodes it itself; asked for, it hands base64 over.
    decoded_by_sdk = client.embeddings.create(model="", input=TEXTS)
    as_base64 = client.embeddings.create(model="", input=TEXTS, encoding_format="base64")
    from_base64 = [_floats(item.embedding) for item in as_base64.data]
    for response in (as_floats, decoded_by_sdk):
        assert [item.index for item in response.data] == list(range(len(TEXTS)))
        got = torch.tensor([item.embedding for item in response.data])
        torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)
        assert response.model == as_base64.model != ""
    torch.testing.assert_close(torch.tensor(from_base64), expected, rtol=0, atol=ATOL)
    assert as_floats.data[1].embedding == as_floats.data[4].embedding  # exact: identical inputs in one request
    # The same vectors every way, to ATOL: three requests, whose batches can move a component in its last bits.
    floats = torch.tensor([item.embedding for item in as_floats.data])
    torch.testing.assert_close(
        torch.tensor([item.embedding for item in decoded_by_sdk.data]), floats, rtol=0, atol=ATOL
    )
    torch.testing.assert_close(torch.tensor(from_base64), floats, rtol=0, atol=ATOL)
    # Usage counts every input's tokens, the repeat included (as vLLM): [CLS] + words + [SEP] each.
    tokens = sum(len(reference.tokenizer(text)["input_ids"]) for text in TEXTS)
    assert as_floats.usage.prompt_tokens == as_floats.usage.total_tokens == tokens


def test_base64_is_little_endian_float32_of_the_float_answer(minilm: Live) -> None:
    body = {"input": "one text", "encoding_format": "base64"}
    status, encoded = minilm.json("POST", "/v1/embeddings", body)
    assert status == 200 and encoded["object"] == "list" and encoded["data"][0]["object"] == "embedding"
    status, plain = minilm.json("POST", "/v1/embeddings", {"input": "one text"})
    vector = plain["data"][0]["embedding"]
    assert status == 200 and len(vector) == 384
    # float32 exactly (float16 would decode to half as many numbers), the float answer's vector to ATOL: the two
    # requests ran in batches of their own.
    decoded = _floats(encoded["data"][0]["embedding"])
    assert len(decoded) == len(vector)
    torch.testing.assert_close(torch.tensor(decoded), torch.tensor(vector), rtol=0, atol=ATOL)


def test_tei_embed_normalizes_by_default_and_answers_the_pooled_vector_without(
    minilm: Live, reference: SentenceTransformer
) -> None:
    with httpx.Client(base_url=minilm.url, timeout=60) as client:
        default = client.post("/embed", json={"inputs": TEXTS})
        raw = client.post("/embed", json={"inputs": TEXTS, "normalize": False})
        one = client.post("/embed", json={"inputs": TEXTS[0]})
    assert default.status_code == raw.status_code == one.status_code == 200
    torch.testing.assert_close(torch.tensor(default.json()), _normalized(reference, TEXTS), rtol=0, atol=ATOL)
    pooled = _pooled(reference, TEXTS)
    torch.testing.assert_close(torch.tensor(raw.json()), pooled, rtol=0, atol=ATOL)
    assert pooled.norm(dim=1).min() > 1.5, "MiniLM's pooled vectors are not unit length: the test would be blind"
    # Another request, so another batch: one text alone is not padded like the batch of six, and the CPU's kernels
    # may sum it in another order (equal here on an AMD EPYC, 5e-8 apart on an Intel Xeon with AVX-512).
    torch.testing.assert_close(torch.tensor(one.json()), torch.tensor(default.json()[:1]), rtol=0, atol=ATOL)


def test_tei_truncate_cuts_an_over_long_input_and_its_absence_refuses_it(
    minilm: Live, reference: SentenceTransformer
) -> None:
    long_text = "the quick brown fox jumps over the lazy dog " * 80  # about 720 tokens, over MiniLM's 256
    with httpx.Client(base_url=minilm.url, timeout=60) as client:
        refused = client.post("/embed", json={"inputs": ["short", long_text], "truncate": None})  # TEI's null
        cut = client.post("/embed", json={"inputs": [long_text], "truncate": True})
        left = client.post("/embed", json={"inputs": [long_text], "truncate": True, "truncation_direction": "Left"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "input_tokens" and error["message"].startswith("inputs[1]")
    assert cut.status_code == left.status_code == 200
    _, cards = minilm.json("GET", "/v1/models")
    assert cards["data"][0]["max_model_len"] == reference.max_seq_length  # both cut at the same length
    torch.testing.assert_close(torch.tensor(cut.json()), _normalized(reference, [long_text]), rtol=0, atol=ATOL)
    assert cut.json() != left.json()


def test_two_hundred_inputs_run_in_shared_batches(small_batches: tuple[ScorekitApp, Live]) -> None:
    app, live = small_batches
    assert app.engine is not None
    start = app.engine.snapshot().worker
    texts = [f"text number {i} about topic {i % 7}" for i in range(200)]
    response = _openai(live).embeddings.create(model="", input=texts)
    assert len(response.data) == 200
    end = app.engine.snapshot().worker
    ran = end.items - start.items
    assert ran == 200
    # Each batch holds up to max_batch_size inputs: far fewer batches than inputs.
    assert end.batches - start.batches <= -(-200 // app.settings.models[0].engine.max_batch_size) + 1
    assert max(list(end.recent_batch_sizes)[-(end.batches - start.batches) :]) > 1


def test_a_disconnect_during_a_large_embed_drops_its_queued_inputs(small_batches: tuple[ScorekitApp, Live]) -> None:
    app, live = small_batches
    engine = app.engine
    assert engine is not None
    batch_size = app.settings.models[0].engine.max_batch_size
    start = engine.snapshot().worker
    start_items, start_late = start.items, start.items_of_cancelled_jobs
    sock = live.send_json("/v1/embeddings", {"input": many_docs(2000)})
    assert wait_for(lambda: engine.snapshot().worker.items >= start_items + 3 * batch_size, timeout=30), (
        "the embed never ran"
    )
    assert live.load() == 1
    sock.close()
    assert live.wait_load(0) == 0
    assert wait_for(lambda: engine.snapshot().queued_items == 0)
    end = settled_stats(app)  # a batch still on the model has landed
    # Once the job is cancelled, only the batch already on the model may still run for it.
    assert end.items_of_cancelled_jobs - start_late <= batch_size
    assert end.items - start_items < 2000
    status, _ = live.json("POST", "/v1/embeddings", {"input": "still serving"})
    assert status == 200


def test_a_cross_encoder_cannot_embed(cross_encoder: Live) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        _openai(cross_encoder).embeddings.create(model="tiny-ce", input="text")
    assert raised.value.status_code == 404
    status, body = cross_encoder.json("POST", "/embed", {"inputs": "text"})
    assert status == 404
    assert body["error"]["code"] == 404 and "Embed API" in body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": "x", "dimensions": 385}, "dimensions"),
        ("/v1/embeddings", {"input": [[101, 2054, 102]]}, "input"),
        ("/v1/embeddings", {"input": [101, 2054, 102]}, "input"),
        ("/v1/embeddings", {"input": 3}, "body.input"),
        ("/v1/embeddings", {"input": ["a", None]}, "body.input"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "body.encoding_format"),
        ("/v1/embeddings", {}, "body.input"),
        ("/embed", {"inputs": []}, "inputs"),
        ("/embed", {"inputs": [1]}, "body.inputs"),
        ("/embed", {"inputs": "x", "normalize": "yes"}, "body.normalize"),
        ("/embed", {"inputs": "x", "truncation_direction": "up"}, "body.truncation_direction"),
    ],
)
def test_bad_embedding_requests_are_a_400_naming_the_field(minilm: Live, path: str, body: Any, param: str) -> None:
    status, answer = minilm.json("POST", path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["code"] == 400


def test_the_dimensions_refusal_says_why(minilm: Live) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        _openai(minilm).embeddings.create(model="", input="x", dimensions=385)
    assert "dimensions must be between 1 and 384 (the model's embedding size)" in str(raised.value)
    cut = _openai(minilm).embeddings.create(model="", input="x", dimensions=128)  # the SDK's own field
    assert len(cut.data[0].embedding) == 128
