"""SIGTERM on a real `scorekit serve` process drains: the request in flight finishes, new ones get 503 on
the still-open listener, and the process exits 0 once the request is done; a request that outlives the
shutdown timeout is answered 503 in the JSON error shape at the deadline, and a second signal does the
same at once. Time bounds here are lower bounds or wide margins: these tests prove order, not speed.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.hardening.conftest import docs, error_of
from tests.hardening.process import log_lines, scorekit_serve, start_slow, until

DOCS = 600
# Far more work than the timeouts below allow, in small batches.
HUGE = docs(3000, words=12)
CUT = "still in flight with 503"


def test_sigterm_drains_then_exits_0(tmp_path: Path) -> None:
    timeout = 60
    with scorekit_serve(tmp_path, "--shutdown-timeout", str(timeout)) as (proc, live, log):
        thread, slow = start_slow(live, docs(DOCS, words=4))
        proc.send_signal(signal.SIGTERM)
        until(lambda: live.request("GET", "/health", timeout=5)[0] == 503, 30, "/health did not turn 503")
        status, headers, raw = live.request("POST", "/rerank", {"query": "q", "documents": ["d"]}, timeout=10)
        refused = time.monotonic()
        error = error_of(status, raw, 503)
        assert "shutting down" in error["message"] and headers.get("retry-after") == "1"
        assert headers.get("connection") == "close"

        thread.join(120)
        assert slow.get("status") == 200, slow
        assert len(slow["body"]["results"]) == DOCS
        assert slow["done"] > refused, "the slow request finished before draining could be observed"
        assert proc.wait(timeout=timeout) == 0, log.read_text()[-3000:]
        # It left when the request was done, not at the deadline: nothing was cut.
        assert not log_lines(log, CUT), log.read_text()[-3000:]
        assert log_lines(log, "draining")


def test_sigterm_answers_a_request_that_outlives_the_timeout_with_a_json_503(tmp_path: Path) -> None:
    timeout = 3
    with scorekit_serve(tmp_path, "--shutdown-timeout", str(timeout)) as (proc, live, log):
        thread, slow = start_slow(live, HUGE)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Wide margin: one shutdown timeout, the lifespan's shutdown and the interpreter's exit.
        assert proc.wait(timeout=timeout + 60) == 0, log.read_text()[-3000:]
        thread.join(30)
        error = error_of(slow.get("status", 0), slow.get("raw", b""), 503)
        assert "shutting down" in error["message"] and error["type"] == "ServiceUnavailableError"
        assert slow["headers"].get("connection") == "close"
        # Not before the deadline (the server's clock started after ours: a lower bound holds on any machine).
        assert slow["done"] - signalled >= timeout
        text = log.read_text()
        assert len(log_lines(log, CUT)) == 1, text[-3000:]
        assert "1 request(s) still in flight" in text
        assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]


def test_a_second_signal_answers_what_is_in_flight_and_exits_at_once(tmp_path: Path) -> None:
    timeout = 600  # the second signal, not the timeout, must end this drain
    with scorekit_serve(tmp_path, "--shutdown-timeout", str(timeout)) as (proc, live, log):
        thread, slow = start_slow(live, HUGE)
        proc.send_signal(signal.SIGTERM)
        until(lambda: bool(log_lines(log, "draining")), 30, "the drain did not start")
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        thread.join(30)
        error = error_of(slow.get("status", 0), slow.get("raw", b""), 503)
        assert "shutting down" in error["message"]
        text = log.read_text()
        assert len(log_lines(log, "a second signal")) == 1, text[-3000:]
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
