"""Schemathesis fuzzes every operation of a live server's /openapi.json: never a 5xx, never a hang.

The schema is fetched from the running server (in-thread uvicorn), so what is fuzzed is what is served.
Each operation gets a few positive examples (schema-valid bodies: random text through the real tokenizer
and model), a few more with the served model's name filled in (so the bodies get past the model check
and reach the engine), and a few negative ones (schema-invalid bodies). Every response must be a 2xx or
4xx that conforms to the document: its status is documented, its body matches the response schema, a
schema-invalid body is rejected, and every 4xx is the error shape with ``code == status``. Each call has
a client timeout, so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis import checks as st_checks

from scorekit.api.score import SPELLINGS
from scorekit.app import create_app
from scorekit.settings import Settings
from tests.hardening.conftest import error_of
from tests.live import Live, serve
from tests.tiny_models import build_causal_lm

EXAMPLES = 10
CALL_TIMEOUT = 20.0
CHECKS = [
    st_checks.not_a_server_error,
    st_checks.status_code_conformance,
    st_checks.content_type_conformance,
    st_checks.response_schema_conformance,
    st_checks.negative_data_rejection,
]
SCORING = ("/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")
GENERATIVE = ("/generative_scoring",)


@pytest.fixture(scope="module")
def minilm_server() -> Iterator[Live]:
    # A small item limit keeps the random lists cheap; everything else is as `scorekit serve` runs it.
    with serve(create_app(Settings(max_items_per_request=16))) as live:
        yield live


@pytest.fixture(scope="module")
def causal_lm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    folder = build_causal_lm(tmp_path_factory.mktemp("fuzz-lm"))
    with serve(create_app(Settings.for_model(str(Path(folder)), name="tiny-lm"))) as live:
        yield live


def _served(name: str) -> Any:
    """Fill in the served model's name (and, for /score, keep one spelling of the two sides), so that
    schema-valid bodies get past the checks the schema cannot express and reach the engine."""

    def fill(case: Case) -> Case:
        if isinstance(case.body, dict):
            body = {**copy.deepcopy(case.body), "model": name}
            if case.operation.path.endswith("/score"):
                body = _one_spelling(body)
            case.body = body
        return case

    return fill


def _one_spelling(body: dict[str, Any]) -> dict[str, Any]:
    sides = {field for pair in SPELLINGS for field in pair}
    pair = next((pair for pair in SPELLINGS if any(body.get(field) is not None for field in pair)), SPELLINGS[0])
    kept = {key: value for key, value in body.items() if key not in sides}
    return {**kept, **{field: body.get(field) or "x" for field in pair}}


def _fuzz(live: Live, paths: tuple[str, ...]) -> dict[str, set[int]]:
    status, document = live.json("GET", "/openapi.json")
    assert status == 200
    schema = schemathesis.openapi.from_dict(document)
    model = live.json("GET", "/v1/models")[1]["data"][0]["id"]
    statuses: dict[str, set[int]] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {operation.path for operation in operations} >= set(paths)
    for operation in operations:
        if operation.path not in paths:
            continue
        strategies = [operation.as_strategy(generation_mode=GenerationMode.POSITIVE)]
        if operation.method.upper() == "POST":
            strategies.append(operation.as_strategy(generation_mode=GenerationMode.POSITIVE).map(_served(model)))
            strategies.append(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        _run(live, strategies, statuses.setdefault(operation.label, set()))
    return statuses


def _run(live: Live, strategies: list[Any], seen: set[int]) -> None:
    @settings(
        max_examples=EXAMPLES * len(strategies),
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(strategies))
    def call(case: Case) -> None:
        response = case.call(base_url=live.url, timeout=CALL_TIMEOUT)
        seen.add(response.status_code)
        assert response.status_code < 500, (case.as_curl_command(), response.status_code, response.text[:500])
        case.validate_response(response, checks=CHECKS)
        if response.status_code >= 400:
            error_of(response.status_code, response.content, response.status_code)

    call()


def test_fuzz_scoring_and_service_routes(minilm_server: Live) -> None:
    service = ("/health", "/load", "/v1/models", "/metrics", "/openapi.json")
    statuses = _fuzz(minilm_server, SCORING + service)
    # The fuzz reached the model, not only the validators.
    assert 200 in statuses["POST /rerank"] | statuses["POST /v1/rerank"] | statuses["POST /v2/rerank"], statuses
    assert 200 in statuses["POST /score"] | statuses["POST /v1/score"], statuses
    assert all(code < 500 for codes in statuses.values() for code in codes)
    assert minilm_server.wait_load(0) == 0
    assert minilm_server.request("GET", "/health")[0] == 200


def test_fuzz_generative_scoring(causal_lm_server: Live) -> None:
    statuses = _fuzz(causal_lm_server, GENERATIVE)
    assert all(code < 500 for codes in statuses.values() for code in codes), statuses
    assert causal_lm_server.request("GET", "/health")[0] == 200
