"""E9 (docs/invariants.md): a JSON body is taken by its media type, whatever its parameters and letter case.

Clients that say ``Content-Type: application/json; charset=utf-8`` are common (Java's and .NET's HTTP clients,
axios, requests with an explicit header), and media types are case-insensitive (RFC 9110, 8.3.1): vLLM, whose
check scorekit's follows, compares the lowercased type before its first ``;``. Every other media type is a 400
in vLLM's words. The mutation audit of issue 28 found the parameters and the case guarded by no test: every
request in the suite sent a bare ``application/json``. Over a real socket, on the embedded model.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.live import Live

pytestmark = pytest.mark.e2e

RERANK = {"query": "what is a panda?", "documents": ["The giant panda is a bear.", "Paris is in France."]}


def ranking(body: dict[str, Any]) -> list[int]:
    return [row["index"] for row in body["results"]]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "application/json ; charset=utf-8",
        "Application/JSON",
        "APPLICATION/JSON; CHARSET=UTF-8",
    ],
)
def test_E9_a_json_content_type_with_parameters_or_in_capitals_is_accepted(minilm: Live, content_type: str) -> None:
    status, plain = minilm.json("POST", "/rerank", RERANK)
    assert status == 200, plain
    status, answer = minilm.json("POST", "/rerank", RERANK, headers={"content-type": content_type})
    assert status == 200, answer
    assert ranking(answer) == ranking(plain)
    status, scored = minilm.json(
        "POST", "/score", {"queries": "q", "documents": ["a"]}, headers={"content-type": content_type}
    )
    assert status == 200, scored


@pytest.mark.parametrize(
    "content_type",
    ["text/plain; charset=utf-8", "application/jsonl", "application/x-www-form-urlencoded; charset=utf-8", ""],
)
def test_E9_any_other_media_type_is_refused(minilm: Live, content_type: str) -> None:
    status, answer = minilm.json("POST", "/rerank", RERANK, headers={"content-type": content_type})
    assert status == 400, answer
    assert answer["error"]["message"] == "Unsupported Media Type: Only 'application/json' is allowed"
