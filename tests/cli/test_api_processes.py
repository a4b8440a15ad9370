"""``scorekit serve --api-processes 2`` as processes, over real sockets: two front ends share the port and feed one
model host process, and the lifecycle guarantees hold across the boundary.

Which front end a connection reaches is the kernel's choice (the first to accept it): each test finds the owner
of its connections in /proc (tests/front_ends.py) and repeats until both front ends took part, a bounded number
of times. The host is paused with SIGSTOP where work must stay queued. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scorekit.serving import HOST_DIED_EXIT
from tests.e2e.texts import many_docs
from tests.front_ends import front_end_pids, gone, host_pids, owner
from tests.hardening.process import log_lines, scorekit_serve, until
from tests.live import Live, close_answers, read_response

FLAGS = ("--api-processes", "2", "--small-job-lane", "0")
# Connections opened at most to have both front ends take one: each is the kernel's coin toss.
TRIES = 40
RERANK = {"query": "a query", "documents": ["one document", "another one"], "return_documents": False}


class Group:
    """A running ``scorekit serve --api-processes 2``: its supervisor, the port, the log, and its processes."""

    def __init__(self, proc: subprocess.Popen[bytes], live: Live, log: Path) -> None:
        self.proc, self.live, self.log = proc, live, log

    @property
    def front_ends(self) -> list[int]:
        return front_end_pids(self.proc.pid)

    @property
    def host(self) -> int:
        (pid,) = host_pids(self.proc.pid)
        return pid

    def ask(self, method: str, path: str, body: Any = None) -> tuple[int, int, bytes]:
        """One request on a fresh keep-alive connection: the front end that answered, the status and the body."""
        pid, status, _, raw = self.ask_with(method, path, body)
        return pid, status, raw

    def ask_with(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, int, dict[str, str], bytes]:
        """:meth:`ask` with ``headers`` sent, and the answer's headers too."""
        with self.live.connect(30) as sock:
            sock.sendall(_request(method, path, body, headers or {}))
            status, answer, raw = read_response(sock)
            return owner(sock, self.front_ends), status, answer, raw

    def from_both(self, ask: Callable[[], tuple[int, Any]]) -> dict[int, Any]:
        """``ask`` (which returns the front end that answered, and what) until both front ends have answered."""
        answers: dict[int, Any] = {}
        for _ in range(TRIES):
            pid, answer = ask()
            answers.setdefault(pid, answer)
            if len(answers) == 2:
                return answers
        raise AssertionError(f"in {TRIES} connections only {sorted(answers)} answered")

    def hold(self, request: bytes, *, fronts: int = 2) -> list[tuple[int, socket.socket]]:
        """``request`` sent on new connections left open, until ``fronts`` front ends hold one each."""
        held: list[tuple[int, socket.socket]] = []
        for _ in range(TRIES):
            sock = self.live.connect(60)
            sock.sendall(request)
            held.append((owner(sock, self.front_ends), sock))
            if len({pid for pid, _ in held}) == fronts:
                return held
        raise AssertionError("one front end accepted every connection")

    def load(self) -> dict[int, Any]:
        """/load as each front end answers it."""

        def ask() -> tuple[int, Any]:
            pid, status, raw = self.ask("GET", "/load")
            assert status == 200, raw
            return pid, json.loads(raw)

        return self.from_both(ask)

    def load_is(self, count: int) -> bool:
        return all(answer == {"server_load": count, "models": {"tiny-ce": count}} for answer in self.load().values())

    def admitted(self) -> int:
        status, payload = self.live.json("GET", "/load")
        assert status == 200
        return int(payload["models"]["tiny-ce"])

    def counted(self, sample: str, **labels: str) -> dict[int, float]:
        """A sample of /metrics as each front end answers it (0 when absent)."""
        key = (sample, tuple(sorted(labels.items())))

        def ask() -> tuple[int, float]:
            pid, status, raw = self.ask("GET", "/metrics")
            assert status == 200
            return pid, _samples(raw.decode()).get(key, 0.0)

        return self.from_both(ask)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _request(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data


@contextmanager
def _served(tmp_path: Path, model: Path, *flags: str) -> Iterator[Group]:
    with scorekit_serve(tmp_path, f"tiny-ce={model}", *FLAGS, *flags) as (proc, live, log):
        group = Group(proc, live, log)
        until(lambda: log_lines(log, "front-end processes (pids"), 60, "the two front ends never both served")
        yield group


@pytest.fixture(scope="module")
def group(cross_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """One server for the module's tests that leave it serving (each start costs seconds of three processes
    importing torch); stopped with SIGTERM at the end."""
    with _served(tmp_path_factory.mktemp("api-processes"), cross_encoder_dir) as served:
        yield served
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(60) == 0, served.log.read_text()[-3000:]


@contextmanager
def _paused(pid: int) -> Iterator[None]:
    """The host stopped (SIGSTOP): what is sent to it stays queued until the block ends (or SIGCONT)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed meanwhile, and reaped
            os.kill(pid, signal.SIGCONT)


def test_both_front_ends_serve_the_scores_of_the_model(group: Group) -> None:
    def ask() -> tuple[int, Any]:
        pid, status, raw = group.ask("POST", "/score", {"queries": "q", "documents": ["a b", "c d e"]})
        assert status == 200, raw
        return pid, [item["score"] for item in json.loads(raw)["data"]]

    first, second = group.from_both(ask).values()
    assert close_answers(first, second)


def test_every_front_end_answers_the_exact_load_of_all_and_it_returns_to_0(group: Group) -> None:
    """Requests held at a paused host on both front ends: /load on either answers them all, in total and for
    the model, and 0 once their clients have left (each front end aborting its own)."""
    with _paused(group.host):
        held = group.hold(_request("POST", "/rerank", RERANK))
        until(lambda: group.load_is(len(held)), 30, f"/load never answered {len(held)} on both front ends")
        for _, sock in held:
            sock.close()
        until(lambda: group.load_is(0), 30, "/load never returned to 0 on both front ends")


def test_a_request_still_reading_its_body_counts_on_every_front_end(group: Group) -> None:
    """Load counts from the request's head: a body not yet all sent holds its front end's count, which the other
    front end's /load includes; it returns to 0 when the client leaves."""
    held = group.hold(_request("POST", "/rerank", RERANK)[:-10])
    try:
        until(
            lambda: all(answer["server_load"] == len(held) for answer in group.load().values()),
            30,
            "the load never showed on both front ends",
        )
    finally:
        for _, sock in held:
            sock.close()
    until(lambda: group.load_is(0), 30, "/load never returned to 0 on both front ends")


def test_a_client_that_leaves_has_its_queued_items_never_run(group: Group) -> None:
    """A large request holds the (paused) host; a second one, queued behind it, is left by its client: at most one
    batch of it runs (none when its abort arrives before the worker is free), and every batch is counted once
    in the metrics, whichever front end answers them."""
    (before,) = set(group.counted("scorekit_batch_size_sum", model="tiny-ce").values())
    large = {"query": "q", "documents": many_docs(64), "return_documents": False}
    left = {"query": "q", "documents": many_docs(40), "return_documents": False}
    with _paused(group.host), group.live.connect(60) as first:
        first.sendall(_request("POST", "/rerank", large))
        until(lambda: group.admitted() == 1, 30, "the large request never reached the model")
        leaving = group.live.connect(60)
        leaving.sendall(_request("POST", "/rerank", left))
        until(lambda: group.admitted() == 2, 30, "the second request never reached the model")
        leaving.close()
        until(lambda: group.admitted() == 1, 30, "the second request's front end never let it go")
        os.kill(group.host, signal.SIGCONT)
        status, _, raw = read_response(first)
        assert status == 200, raw
    until(
        lambda: min(group.counted("scorekit_batch_size_sum", model="tiny-ce").values()) >= before + 64,
        30,
        "the large request's batches were never all counted",
    )
    (after,) = set(group.counted("scorekit_batch_size_sum", model="tiny-ce").values())
    assert 64 <= after - before <= 64 + 8, after - before  # --max-batch-size 8: one batch of the left one at most


def test_metrics_count_every_front_end_s_requests_once(group: Group) -> None:
    """Each front end's /metrics answers the same totals: the sum of what every front end counted."""
    labels = {"route": "/version", "status": "200"}
    (before,) = set(group.counted("scorekit_requests_total", **labels).values())
    answered: list[int] = []
    while len(set(answered)) < 2 and len(answered) < TRIES:
        answered.append(group.ask("GET", "/version")[0])
    assert len(set(answered)) == 2, answered
    # Each front end counts a request once its answer is sent: the last one may be a moment late.
    expected = {before + len(answered)}
    until(lambda: set(group.counted("scorekit_requests_total", **labels).values()) == expected, 10, f"not {expected}")


def test_bad_input_is_answered_in_the_front_end_and_never_reaches_the_host(group: Group) -> None:
    (before,) = set(group.counted("scorekit_batch_size_count", model="tiny-ce").values())

    def bad() -> tuple[int, Any]:
        pid, status, raw = group.ask("POST", "/rerank", {"query": "q", "documents": ["a"], "top_n": -1})
        return pid, (status, json.loads(raw)["error"]["code"])

    assert set(group.from_both(bad).values()) == {(400, 400)}
    assert set(group.counted("scorekit_batch_size_count", model="tiny-ce").values()) == {before}


def test_a_front_end_that_dies_is_replaced_and_its_load_cleared(group: Group) -> None:
    """SIGKILL to a front end holding requests: its row of the load board is cleared (its connections died with
    it), a new front end takes its place in the row, and the server serves on."""
    with _paused(group.host):
        held = group.hold(_request("POST", "/rerank", RERANK), fronts=1)
        victim = held[0][0]
        until(lambda: group.admitted() == len(held), 30, "the held requests never reached the model")
        os.kill(victim, signal.SIGKILL)
        until(lambda: victim not in group.front_ends and len(group.front_ends) == 2, 60, "no front end replaced it")
    # The host resumed: the replacement joins it and serves; the connections that reached its socket meanwhile
    # waited for it.
    until(lambda: group.load_is(0), 60, "the dead front end's load was never cleared")
    for _, sock in held:
        sock.close()
    assert log_lines(group.log, f"(pid {victim}) exited with status {-signal.SIGKILL}: replaced")


def test_sigterm_drains_every_front_end_then_stops_the_host(cross_encoder_dir: Path, tmp_path: Path) -> None:
    """Requests held on both front ends finish with 200 after SIGTERM, while a new request is refused with 503;
    the host stops only once every front end has exited, and the server exits 0."""
    with _served(tmp_path, cross_encoder_dir) as group:
        host, fronts = group.host, group.front_ends
        with _paused(host):
            held = group.hold(_request("POST", "/rerank", RERANK))
            until(lambda: group.admitted() == len(held), 30, "the held requests never reached the model")
            group.proc.send_signal(signal.SIGTERM)
            until(lambda: len(log_lines(group.log, "draining: waiting")) == 2, 30, "the front ends never drained")
            status, _, _ = group.live.request("POST", "/rerank", RERANK, timeout=30)
            assert status == 503
        for _, sock in held:
            status, _, raw = read_response(sock)
            assert status == 200, raw
            sock.close()
        assert group.proc.wait(60) == 0, group.log.read_text()[-3000:]
    assert all(gone(pid) for pid in [*fronts, host])
    assert log_lines(group.log, "every front end has drained: stopping the model host")


def test_a_dead_host_fails_every_front_end_s_requests_and_the_server_exits_3(
    cross_encoder_dir: Path, tmp_path: Path
) -> None:
    """Requests held at the host on both front ends fail at once when it is killed; every front end drains and
    exits (answering 503 meanwhile), and so does the server, with its own status and one line naming the model
    and the host's exit status. A server of its own: the module's must live on for the other tests, whatever
    order they run in (the mutation check runs a mutant's tests in its own order)."""
    with _served(tmp_path, cross_encoder_dir) as group:
        host, fronts = group.host, group.front_ends
        with _paused(host):
            held = group.hold(_request("POST", "/rerank", RERANK))
            until(lambda: group.admitted() == len(held), 30, "the held requests never reached the model")
            os.kill(host, signal.SIGKILL)
        for _, sock in held:  # failed at once, as a dead worker's requests are in one process (500, its reason)
            status, _, raw = read_response(sock)
            assert (status, json.loads(raw)["error"]["message"]) == (500, "The model host process lost its connection.")
            sock.close()
        assert group.proc.wait(60) == HOST_DIED_EXIT, group.log.read_text()[-3000:]
    line = f"scorekit: error: the model host process of model 'tiny-ce' exited with status {-signal.SIGKILL}"
    assert log_lines(group.log, line) == [line], group.log.read_text()[-3000:]
    assert all(gone(pid) for pid in fronts)


# Small quotas: one unit refills in 30 or 15 s, far longer than the test takes even on a loaded machine, so every count
# below is exact.
REQUESTS_QUOTA, ITEMS_QUOTA = 2, 4


def test_a_keys_quotas_hold_over_every_front_end_together(cross_encoder_dir: Path, tmp_path: Path) -> None:
    """A key's requests and items a minute are one bucket each for the whole server, not one per front end: the
    quota is served whichever front ends take it, and then both front ends refuse the next. (With a bucket per
    front end, at least one of the two would still have some of its own left.)"""
    keys = tmp_path / "keys"
    quotas = f"k-requests-8c1 requests_per_minute={REQUESTS_QUOTA}\nk-items-2f7 items_per_minute={ITEMS_QUOTA}\n"
    keys.write_text(quotas)
    with _served(tmp_path, cross_encoder_dir, "--api-key-file", str(keys)) as group:
        by_requests = {"Authorization": "Bearer k-requests-8c1"}
        answers = [group.ask_with("GET", "/v1/models", headers=by_requests) for _ in range(REQUESTS_QUOTA)]
        assert [status for _, status, _, _ in answers] == [200] * REQUESTS_QUOTA
        # Each answer says what is left of the one bucket, whichever front end gave it.
        assert [headers["ratelimit-remaining"] for _, _, headers, _ in answers] == ["1", "0"]
        refusals = group.from_both(lambda: _refused(group, "GET", "/v1/models", None, by_requests))
        assert set(refusals.values()) == {"30 s"}  # one request refills in 60 / 2 s

        by_items = {"Authorization": "Bearer k-items-2f7"}  # a tiny cross-encoder's rerank: one input a document
        served = [group.ask_with("POST", "/rerank", RERANK, by_items) for _ in range(ITEMS_QUOTA // 2)]
        assert [status for _, status, _, _ in served] == [200] * (ITEMS_QUOTA // 2), served[-1]
        assert [headers["ratelimit-remaining"] for _, _, headers, _ in served] == ["2", "0"]
        refusals = group.from_both(lambda: _refused(group, "POST", "/rerank", RERANK, by_items))
        assert set(refusals.values()) == {"30 s"}  # two inputs refill in 2 * 60 / 4 s
        group.proc.send_signal(signal.SIGTERM)
        assert group.proc.wait(60) == 0, group.log.read_text()[-3000:]


def _refused(group: Group, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, str]:
    pid, status, answer, raw = group.ask_with(method, path, body, headers)
    assert status == 429, (pid, status, raw)
    return pid, f"{answer['retry-after']} s"
