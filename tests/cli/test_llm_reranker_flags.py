"""The LLM-reranker and long-document flags: each mistake is one line at start-up, not a server that refuses
every request later."""

from __future__ import annotations

from tests.cli.conftest import one_line_error, scorekit
from tests.live import free_port


def test_chunking_by_default_with_a_bi_encoder_is_a_start_up_error() -> None:
    """Said once the model has loaded (its kind is known then), after its load line, as the last line."""
    result = scorekit("serve", "--long-documents", "chunk", "--port", str(free_port()))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "is a bi-encoder, which cannot score a document by windows: serve it without --long-documents chunk" in last


def test_a_bad_long_documents_choice_is_argparses_line() -> None:
    message = one_line_error(scorekit("serve", "--long-documents", "split"), 2)
    assert "invalid choice: 'split'" in message
