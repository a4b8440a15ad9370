"""API keys and CORS from Settings, over real uvicorn with the embedded model and real clients.

A request without one of the keys gets 401 in the error shape before it reaches the router: no model work
(the worker's own counters) and no load. The probes stay open; the keys never reach a log. The CORS
middleware sits above the key check, so a browser's preflight (which carries no credentials) is answered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import cohere
import httpx
import openai
import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import Settings
from tests.live import Live, serve

pytestmark = pytest.mark.e2e

KEYS = ("k1-8d0c4c6e", "k2-51b7f2aa")
ORIGIN = "https://app.example"
RERANK = {"query": "capital of France", "documents": ["Paris is the capital of France.", "Bananas are yellow."]}
OPEN = ("/health", "/healthz", "/readyz", "/ping", "/metrics", "/load")


@pytest.fixture(scope="module")
def keyed_app() -> ScorekitApp:
    return create_app(Settings(api_keys=KEYS, allowed_origins=(ORIGIN,)))


@pytest.fixture(scope="module")
def keyed(keyed_app: ScorekitApp) -> Iterator[Live]:
    with serve(keyed_app) as live:
        yield live


def _bearer(key: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {key}"}


def _items(app: ScorekitApp) -> int:
    assert app.engine is not None
    return app.engine.snapshot().worker.items


def test_a_request_without_a_right_key_gets_401_and_does_no_work(keyed_app: ScorekitApp, keyed: Live) -> None:
    keyed.json("POST", "/rerank", RERANK, headers=_bearer(KEYS[0]))  # the model has run once
    before = _items(keyed_app)
    refusals: list[dict[str, str]] = [{}, _bearer("wrong"), _bearer(KEYS[0] + "x"), _bearer(KEYS[0], "Basic")]
    for headers in refusals:
        for path in ("/rerank", "/v1/embeddings", "/v1/models", "/nowhere"):
            status, answer, raw = keyed.request("POST", path, RERANK, headers=headers)
            assert status == 401, (path, headers)
            assert answer["www-authenticate"] == "Bearer"
            assert raw == b'{"error":{"message":"Unauthorized","type":"UnauthorizedError","param":null,"code":401}}'
    assert keyed.wait_load(0) == 0
    assert _items(keyed_app) == before


def test_either_key_scores_as_an_open_server_does(keyed: Live, minilm: Live) -> None:
    _, expected = minilm.json("POST", "/rerank", RERANK)
    for key, scheme in ((KEYS[0], "Bearer"), (KEYS[1], "bearer")):
        status, got = keyed.json("POST", "/rerank", RERANK, headers=_bearer(key, scheme))
        assert status == 200
        assert [r["index"] for r in got["results"]] == [r["index"] for r in expected["results"]]
        assert [r["relevance_score"] for r in got["results"]] == pytest.approx(
            [r["relevance_score"] for r in expected["results"]], abs=1e-6
        )


def test_the_probes_need_no_key(keyed: Live) -> None:
    for path in OPEN:
        assert keyed.request("GET", path)[0] == 200, path
    assert keyed.request("POST", "/ping")[0] == 200


def test_no_key_reaches_a_log(keyed: Live, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.DEBUG):
        keyed.request("POST", "/rerank", RERANK, headers=_bearer(KEYS[0]))
        keyed.request("POST", "/rerank", RERANK, headers=_bearer(KEYS[1] + "-wrong"))
    out, err = capfd.readouterr()
    for key in KEYS:
        assert key not in caplog.text and key not in out and key not in err


def test_the_cohere_sdks_rerank_with_a_key(keyed: Live, minilm: Live) -> None:
    """Both clients, v2 with max_tokens_per_doc: each with a key gets what an open server answers."""
    _, expected = minilm.json("POST", "/rerank", {**RERANK, "max_tokens_per_doc": 4})
    scores = {r["index"]: r["relevance_score"] for r in expected["results"]}

    def v2(key: str) -> Any:
        client = cohere.ClientV2(base_url=keyed.url, api_key=key, timeout=60)
        return client.rerank(model="", query=RERANK["query"], documents=RERANK["documents"], max_tokens_per_doc=4)

    def v1(key: str) -> Any:
        client = cohere.Client(base_url=keyed.url, api_key=key, timeout=60)
        return client.rerank(model="", query=RERANK["query"], documents=RERANK["documents"])

    assert {r.index: r.relevance_score for r in v2(KEYS[1]).results} == pytest.approx(scores, abs=1e-6)
    assert v1(KEYS[0]).results[0].index == 0
    for call in (v1, v2):
        with pytest.raises(cohere.errors.UnauthorizedError):
            call("wrong")


def test_a_tei_client_reranks_with_a_key(keyed: Live, minilm: Live) -> None:
    body = {"query": RERANK["query"], "texts": RERANK["documents"], "return_text": True}
    expected = httpx.post(f"{minilm.url}/rerank", json=body, timeout=60).json()
    got = httpx.post(f"{keyed.url}/rerank", json=body, headers=_bearer(KEYS[0]), timeout=60)
    assert got.status_code == 200
    assert [rank["index"] for rank in got.json()] == [rank["index"] for rank in expected]
    assert [rank["score"] for rank in got.json()] == pytest.approx([rank["score"] for rank in expected], abs=1e-6)
    assert httpx.post(f"{keyed.url}/rerank", json=body, timeout=60).status_code == 401


def test_the_openai_sdk_embeds_with_a_key(keyed: Live) -> None:
    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0)

    floats = client(KEYS[0]).embeddings.create(model="", input=["a", "b"], encoding_format="float")
    decoded = client(KEYS[0]).embeddings.create(model="", input=["a", "b"])  # base64 on the wire
    assert len(floats.data) == len(decoded.data) == 2
    assert decoded.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)
    with pytest.raises(openai.AuthenticationError) as raised:
        client("wrong").embeddings.create(model="", input="a")
    assert raised.value.status_code == 401


def test_a_preflight_needs_no_key_and_answers_carry_the_origin(keyed: Live) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x"}
    status, headers, _ = keyed.request("OPTIONS", "/rerank", headers=preflight)
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    status, headers, _ = keyed.request("POST", "/rerank", RERANK, headers={"Origin": ORIGIN, **_bearer(KEYS[0])})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    exposed = set(headers["access-control-expose-headers"].split(", "))
    assert {"x-model-seconds", "ratelimit-remaining", "retry-after"} <= exposed  # a page's script can read them
    assert "x-model-seconds" in headers
    status, headers, _ = keyed.request("POST", "/rerank", RERANK, headers={"Origin": ORIGIN})
    assert status == 401 and headers["access-control-allow-origin"] == ORIGIN  # a browser can read the refusal
    status, headers, _ = keyed.request("POST", "/rerank", RERANK, headers={"Origin": "https://elsewhere.example"})
    assert status == 401 and "access-control-allow-origin" not in headers


def test_without_origins_a_preflight_is_refused(minilm: Live) -> None:
    status, _, _ = minilm.request(
        "OPTIONS", "/rerank", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    )
    assert status == 405
