"""Hostile request bodies each get their intended 4xx in the error shape, and the server keeps serving.

One shared server with the default settings (16 MiB body limit, 10,000 items per request). Every case
is sent over a real socket; each answer must be the JSON error shape with ``code == status`` and a
message without tracebacks, addresses or paths. After all of them, /health is 200 and a normal
request still scores exactly as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import Settings
from tests.hardening.conftest import error_of, json_head, request_head, send_until_answered
from tests.live import Live, close_answers, serve
from tests.tiny_models import build_causal_lm

LIMIT = Settings().max_body_bytes  # 16 MiB; a 50 MB body is over it
ITEMS = Settings().max_items_per_request  # 10,000
FIFTY_MB = 50 * 1000 * 1000
NORMAL = {"query": "what is a cat", "documents": ["a cat is a small feline", "the stock market fell"]}


@dataclass(frozen=True)
class Hostile:
    name: str
    body: bytes
    status: int
    path: str = "/rerank"
    content_type: str | None = "application/json"
    param: str | None = None
    says: str | tuple[str, ...] = ""


def _rerank(**extra: object) -> bytes:
    return json.dumps({"query": "q", "documents": ["d"], **extra}).encode()


def _raw_rerank(field: str, literal: str) -> bytes:
    return b'{"query": "q", "documents": ["d"], "%s": %s}' % (field.encode(), literal.encode())


DEEP = 100_000
DEEP_OBJECT = '{"a":' * DEEP + "1" + "}" * DEEP
ONE_MB_DOC = "word " * 200_000  # 1 MB, about 200,000 tokens; the model takes 256
TOO_LONG = "Please reduce the length of the input prompt"
MANY = ["d"] * 100_000


def _json(**fields: object) -> bytes:
    return json.dumps(fields).encode()


ONE_MB_BODY = _json(query="q", documents=["d", ONE_MB_DOC])

CASES = [
    Hostile("not json", b"{this is not json", 400, says="Invalid JSON"),
    Hostile("empty body", b"", 400, says="Invalid JSON"),
    Hostile("json array", b"[]", 400),
    Hostile("json string", b'"abc"', 400),
    Hostile("json null", b"null", 400),
    Hostile("deep arrays at the top", b"[" * DEEP + b"]" * DEEP, 400),
    Hostile("deep arrays in a field", b'{"query": "q", "documents": ' + b"[" * DEEP + b"]" * DEEP + b"}", 400),
    Hostile("deep arrays in an unknown field", _raw_rerank("extra", "[" * DEEP + "]" * DEEP), 400, says="nested"),
    Hostile("deep objects in an unknown field", _raw_rerank("extra", DEEP_OBJECT), 400),
    Hostile("deep /score", b'{"queries": "q", "documents": "d", "x": %s}' % DEEP_OBJECT.encode(), 400, "/score"),
    Hostile("text/plain", _rerank(), 400, content_type="text/plain", says="Only 'application/json' is allowed"),
    Hostile("form encoded", b"query=q&documents=d", 400, content_type="application/x-www-form-urlencoded"),
    Hostile("no content-type", _rerank(), 400, content_type=None, says="Only 'application/json' is allowed"),
    Hostile("invalid utf-8", b'{"query": "\xff\xfe\xfd", "documents": ["d"]}', 400),
    Hostile("lone surrogate", b'{"query": "\\ud800", "documents": ["d"]}', 400),
    Hostile("NaN top_n", _raw_rerank("top_n", "NaN"), 400),
    Hostile("Infinity top_n", _raw_rerank("top_n", "Infinity"), 400),
    Hostile("-Infinity top_n", _raw_rerank("top_n", "-Infinity"), 400),
    Hostile("1e400 top_n", _raw_rerank("top_n", "1e400"), 400, param="body.top_n"),
    Hostile("10**30 top_n", _raw_rerank("top_n", str(10**30)), 400, param="body.top_n"),
    Hostile("10**30 truncate", _raw_rerank("truncate_prompt_tokens", str(10**30)), 400),
    Hostile("-10**30 truncate", _raw_rerank("truncate_prompt_tokens", str(-(10**30))), 400),
    Hostile("float top_n", _raw_rerank("top_n", "1.5"), 400, param="top_n"),
    Hostile("negative top_n", _rerank(top_n=-1), 400, param="body.top_n"),
    Hostile("query is a list", _json(query=["q"], documents=["d"]), 400, param="body.query"),
    Hostile("unknown model", _rerank(model="gpt-4"), 404, param="model"),
    Hostile("100,000 documents", _json(query="q", documents=MANY), 400, param="documents", says=str(ITEMS)),
    Hostile("100,000 pairs", _json(queries="q", documents=MANY), 400, path="/score", param="documents"),
    Hostile("1 MB document", ONE_MB_BODY, 400, param="input_tokens", says=("documents[1] has", TOO_LONG)),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(hardened: tuple[ScorekitApp, Live]) -> Iterator[Live]:
    _, live = hardened
    status, before = live.json("POST", "/rerank", NORMAL)
    assert status == 200
    yield live
    # After every hostile case: still healthy, still scoring as before (to 1e-5: another request, another batch).
    assert live.request("GET", "/health")[0] == 200
    status, after = live.json("POST", "/rerank", NORMAL)
    assert status == 200 and close_answers(after["results"], before["results"])
    assert live.wait_load(0) == 0


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_body_gets_its_4xx(server: Live, case: Hostile) -> None:
    headers = {"Content-Length": str(len(case.body))}
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    started = time.monotonic()
    status, _, body = send_until_answered(server, request_head("POST", case.path, headers), iter([case.body]))
    error = error_of(status, body, case.status)
    assert time.monotonic() - started < 20  # each takes milliseconds: this only catches a stall (20x+ margin)
    if case.param is not None:
        assert error["param"] == case.param, error
    for phrase in (case.says,) if isinstance(case.says, str) else case.says:
        assert phrase in error["message"], error


def _megabytes(total: int) -> Iterator[bytes]:
    """A syntactically plausible JSON body of ``total`` bytes, one MiB at a time."""
    yield b'{"query": "q", "documents": ["'
    chunk = b"x" * (1 << 20)
    for _ in range(total // len(chunk)):
        yield chunk
    yield b'"]}'


def test_50_mb_body_with_content_length_is_413_before_it_is_read(server: Live) -> None:
    head = json_head("/rerank", b"")
    head = head.replace(b"Content-Length: 0", b"Content-Length: %d" % FIFTY_MB)
    # Only the head is sent: an answer at all proves the server refused without waiting for the body.
    status, _, body = send_until_answered(server, head, iter([]))
    error = error_of(status, body, 413)
    assert error["param"] == "body" and str(LIMIT) in error["message"]


def test_50_mb_chunked_body_without_content_length_is_413(server: Live) -> None:
    head = request_head("POST", "/rerank", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    frames = (b"%x\r\n%s\r\n" % (len(piece), piece) for piece in _megabytes(FIFTY_MB))
    status, _, body = send_until_answered(server, head, frames)
    error = error_of(status, body, 413)
    assert error["param"] == "body"


def test_1_mb_document_is_scored_when_truncated_to_the_model_maximum(server: Live) -> None:
    status, body = server.json(
        "POST", "/rerank", {"query": "q", "documents": ["d", ONE_MB_DOC], "truncate_prompt_tokens": -1}
    )
    assert status == 200, body
    assert sorted(result["index"] for result in body["results"]) == [0, 1]


def test_unknown_fields_are_ignored(server: Live) -> None:
    plain = server.json("POST", "/rerank", NORMAL)
    extra = {**NORMAL, "return_documents": True, "rank_fields": ["text"], "x": {"y": [1]}}
    noisy = server.json("POST", "/rerank", extra)
    assert plain[0] == noisy[0] == 200
    assert close_answers(noisy[1]["results"], plain[1]["results"])  # to 1e-5: two requests, two batches


def test_wrong_method_and_unknown_route_use_the_error_shape(server: Live) -> None:
    status, headers, body = server.request("GET", "/rerank")
    error_of(status, body, 405)
    assert headers["allow"] == "POST"
    status, _, body = server.request("POST", "/nope", {"a": 1})
    error_of(status, body, 404)


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    folder = build_causal_lm(tmp_path_factory.mktemp("hostile-lm"))
    with serve(create_app(Settings.for_model(str(folder), name="tiny-lm"))) as live:
        yield live


def test_too_many_label_ids_is_a_fast_400(causal_lm: Live) -> None:
    # 30,000 labels once held the event loop for over a minute (a quadratic de-duplication), and the
    # answer grows with items x labels: the label list is capped at max_items_per_request.
    body = {"query": "q", "items": ["a", "b"], "label_token_ids": list(range(30_000))}
    started = time.monotonic()
    status, _, raw = causal_lm.request("POST", "/generative_scoring", body)
    error = error_of(status, raw, 400)
    assert error["param"] == "label_token_ids" and str(ITEMS) in error["message"]
    # The quadratic version took over a minute; the linear one, milliseconds. 20 s tells them apart with
    # a margin no loaded machine reaches.
    assert time.monotonic() - started < 20


def test_many_label_ids_under_the_cap_are_scored(causal_lm: Live) -> None:
    labels = [*range(9_000), 5, 5, 7]  # duplicates collapse in the softmax
    status, body = causal_lm.json(
        "POST", "/generative_scoring", {"query": "q", "items": ["a"], "label_token_ids": labels}
    )
    assert status == 200, body
    scores = body["data"][0]["scores"]
    assert len(scores) == len(labels)
    assert sum(scores[:9_000]) == pytest.approx(1.0, abs=1e-3)
    assert scores[-3] == scores[5] and scores[-1] == scores[7]  # exact: the same label twice in one request


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "q", "items": ["a"], "label_token_ids": [10**30]}, "label_token_ids"),
        ({"query": "q", "items": ["a"], "label_token_ids": [-1]}, "label_token_ids"),
        ({"query": [10**30], "items": [[1]], "label_token_ids": [1]}, "query"),
        ({"query": "q", "items": [[1], "a"], "label_token_ids": [1]}, "items"),
        ({"query": "q", "items": [], "label_token_ids": [1]}, "items"),
        ({"query": "q", "items": ["a"], "label_token_ids": []}, "label_token_ids"),
    ],
    ids=["huge label", "negative label", "huge token id", "mixed items", "no items", "no labels"],
)
def test_hostile_generative_bodies(causal_lm: Live, body: dict[str, object], param: str) -> None:
    status, _, raw = causal_lm.request("POST", "/generative_scoring", body)
    assert error_of(status, raw, 400)["param"] == param
