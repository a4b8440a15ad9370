"""The error vocabulary, /v1/models' root, and docs a newcomer can follow from a checkout.

Error ``type`` names must be vLLM's so clients written against vLLM can switch on them; the docs must
point only at files in the repository, by links that resolve.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scorekit.app import create_app
from scorekit.http import VLLM_ERROR_TYPES, HTTPError
from scorekit.models import default_model_path
from scorekit.settings import Settings
from tests.live import Live, read_response, serve

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# vLLM's own spellings (its exception handlers and tests); 405 and 413 have none there, so scorekit's
# names for them only have to follow the same <Phrase>Error pattern.
VLLM_NAMES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}

_ABSOLUTE = re.compile(r"(?<![\w.~-])(?:/work|/tmp|/home)(?![\w-])|\.\./shared")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _emitted_statuses() -> set[int]:
    """Every status the app raises: each ``HTTPError(<status>`` in the package, and 400 from ``bad_request``."""
    found = {400}
    for path in (ROOT / "scorekit").rglob("*.py"):
        found |= {int(code) for code in re.findall(r"HTTPError\(\s*(\d{3})\b", path.read_text(encoding="utf-8"))}
    return found


def test_every_status_the_app_emits_has_a_vllm_spelling() -> None:
    statuses = _emitted_statuses()
    assert {404, 405, 413, 500, 503} <= statuses  # the scan sees the raise sites
    for status in statuses:
        name = HTTPError(status, "x").error_type
        assert name == VLLM_NAMES.get(status, VLLM_ERROR_TYPES.get(status)), status
        assert re.fullmatch(r"(?:[A-Z][a-z]+)+Error", name), (status, name)
    assert {s: VLLM_ERROR_TYPES[s] for s in VLLM_NAMES} == VLLM_NAMES


def test_an_unlisted_status_is_named_by_its_class() -> None:
    assert HTTPError(422, "x").error_type == "BadRequestError"
    assert HTTPError(502, "x").error_type == "InternalServerError"


def _raw(live: Live, head: bytes) -> tuple[int, Any]:
    with socket.create_connection((live.host, live.port), timeout=30) as sock:
        sock.sendall(head)
        status, _headers, body = read_response(sock)
    return status, json.loads(body)


def test_errors_over_the_wire_carry_vllm_names(minilm: Live) -> None:
    """One request per status a running model server answers with, each checked for its ``type``."""
    cases = [
        (400, minilm.json("POST", "/rerank", {"query": "q", "documents": []})),
        (404, minilm.json("POST", "/score", {"model": "gpt-4", "queries": "q", "documents": ["a"]})),
        (404, minilm.json("GET", "/scores")),
        (405, minilm.json("GET", "/rerank")),
        (404, minilm.json("POST", "/generative_scoring", {"query": "q", "items": ["i"], "label_token_ids": [1]})),
        (
            413,
            _raw(
                minilm,
                b"POST /score HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 99999999999\r\nconnection: close\r\n\r\n",
            ),
        ),
    ]
    for expected, (status, body) in cases:
        assert status == expected, (expected, body)
        assert body["error"]["type"] == VLLM_ERROR_TYPES[expected] and body["error"]["code"] == expected
    # A body that fails the schema is FastAPI's RequestValidationError in vLLM: "Bad Request", param body.<field>.
    status, body = minilm.json("POST", "/rerank", {"documents": ["a"]})
    assert (status, body["error"]["type"], body["error"]["param"]) == (400, "Bad Request", "body.query")


@pytest.fixture
def unloaded() -> Iterator[Live]:
    """A server whose model never loads (no lifespan): every scoring request and /health answer 503."""
    with serve(create_app(Settings()), lifespan=False) as live:
        yield live


def test_503_is_service_unavailable_error(unloaded: Live) -> None:
    scoring = unloaded.json("POST", "/rerank", {"query": "q", "documents": ["a"]})
    for status, body in (unloaded.json("GET", "/health"), scoring):
        assert status == 503
        assert body["error"]["type"] == "ServiceUnavailableError", body


def _card(live: Live) -> dict[str, Any]:
    status, models = live.json("GET", "/v1/models")
    assert status == 200 and models["object"] == "list" and len(models["data"]) == 1
    card: dict[str, Any] = models["data"][0]
    return card


def test_models_root_is_the_embedded_model_folder(minilm: Live) -> None:
    card = _card(minilm)
    assert card["id"] == "sentence-transformers/all-MiniLM-L6-v2"  # the name clients send
    root = Path(card["root"])
    assert root == Path(default_model_path()).resolve() and (root / "config.json").is_file()
    assert card["object"] == "model" and card["parent"] is None and card["max_model_len"] == 256
    [permission] = card["permission"]
    assert permission["object"] == "model_permission" and permission["id"].startswith("modelperm-")


def test_models_root_is_the_given_folder_made_absolute(cross_encoder: Live, cross_encoder_dir: Path) -> None:
    card = _card(cross_encoder)
    assert card["id"] == "tiny-ce" and card["root"] == str(cross_encoder_dir.resolve())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(doc):
        if match := re.match(r"#{1,6} (.+)", line):
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _prose(doc: Path) -> Iterator[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_no_path_outside_the_repository(doc: Path) -> None:
    offending = [line for line in doc.read_text(encoding="utf-8").splitlines() if _ABSOLUTE.search(line)]
    assert offending == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_relative_links_resolve(doc: Path) -> None:
    broken = []
    for line in _prose(doc):
        for target in _LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # http(s) and mailto: not ours to check offline
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            missing_file = not file.exists() or not file.is_relative_to(ROOT)
            if missing_file or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                broken.append(target)
    assert broken == []


def test_the_link_check_catches_what_it_should(tmp_path: Path) -> None:
    """The scanners are not vacuous: a bad path, a missing file and a missing anchor are all caught."""
    assert _ABSOLUTE.search("see /work/shared/notes.md") and _ABSOLUTE.search("../shared/x.md")
    assert not _ABSOLUTE.search("a <repository>/.venv path, or /v1/models")
    doc = tmp_path / "x.md"
    doc.write_text("# Top: a heading\n\n[a](#top-a-heading) [b](#nope) [c](missing.md)\n", encoding="utf-8")
    assert _anchors(doc) == {"top-a-heading"}
    assert _LINK.findall(doc.read_text(encoding="utf-8")) == ["#top-a-heading", "#nope", "missing.md"]


def test_invariants_doc_names_real_tests() -> None:
    """Each family's ids run 1..n with no gap, in order (at least Q1-Q16, C1-C10, L1-L5, R1-R4, P1-P2, the ids
    the property tests name), and every test the table names exists."""
    text = (ROOT / "docs" / "invariants.md").read_text(encoding="utf-8")
    ids = re.findall(r"^\| ([QCLRP])(\d+) \|", text, flags=re.MULTILINE)
    families = list(dict.fromkeys(family for family, _ in ids))
    assert families == ["Q", "C", "L", "R", "P"]
    counts = {family: sum(1 for f, _ in ids if f == family) for family in families}
    expected = [(family, str(i)) for family in families for i in range(1, counts[family] + 1)]
    assert ids == expected
    assert [counts[family] >= least for family, least in zip(families, (16, 10, 5, 4, 2), strict=True)] == [True] * 5
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= len(expected)
    for module, test in named:
        source = (ROOT / "tests" / "property" / module).read_text(encoding="utf-8")
        assert re.search(rf"^def {test}\(", source, flags=re.MULTILINE), f"{module}::{test}"
    # The server's (S) and the engine's (E) rules name their tests by their folder under tests/.
    for family in ("S", "E"):
        numbers = re.findall(rf"^\| {family}(\d+) \|", text, flags=re.MULTILINE)
        assert numbers == [str(i) for i in range(1, len(numbers) + 1)] and numbers, family
    elsewhere = re.findall(r"`(\w+/test_\w+\.py)::(test_\w+)`", text)
    assert len(elsewhere) >= 20
    for path, test in elsewhere:
        source = (ROOT / "tests" / path).read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {test}\(", source, flags=re.MULTILINE), f"{path}::{test}"
