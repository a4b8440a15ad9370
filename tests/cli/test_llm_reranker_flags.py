"""The LLM-reranker and long-document flags: each mistake is one line at start-up, not a server that refuses
every request later."""

from __future__ import annotations

from scorekit.app import load_models
from scorekit.cli import parse
from scorekit.models import PairScorer
from tests.cli.conftest import one_line_error, scorekit


def test_chunking_by_default_with_a_bi_encoder_loads() -> None:
    """A bi-encoder scores a long document by its windows too (issue 33, item 4): --long-documents chunk serves
    the embedded model (the refusal is left to pair scorers that cannot chunk: tests/unit/test_load_models.py)."""
    loaded = load_models(parse(["serve", "--long-documents", "chunk"]).settings)
    (backend,) = loaded.backends.values()
    assert isinstance(backend, PairScorer) and backend.kind == "bi-encoder" and backend.chunks_documents


def test_a_bad_long_documents_choice_is_argparses_line() -> None:
    message = one_line_error(scorekit("serve", "--long-documents", "split"), 2)
    assert "invalid choice: 'split'" in message
