"""The probes an orchestrator or a load balancer polls: /healthz (liveness: the process answers), /readyz (readiness:
every model loaded and warmed up by one forward of its longest input, its worker alive, the server not draining),
/health keeping its meaning beside them, HEAD answered as GET without a body on every probe, and a CORS preflight
from an origin the server does not allow refused in the JSON error shape.

The warm-up is made observable by holding the backend's forward on an event: the app's lifespan runs in a thread of
its own while uvicorn serves without one, so the probes can be asked while the warm-up forward is held.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import torch

from scorekit.app import ScorekitApp, create_app, load_models
from scorekit.models.base import Encoded
from scorekit.settings import Settings
from tests.hardening.conftest import scrape
from tests.live import SERVERS, Live, serve
from tests.tiny_models import MAX_POSITIONS

MODEL = "tiny-ce"
PROBES = ("/health", "/healthz", "/readyz", "/ping", "/load", "/metrics")
RERANK = {"query": "q", "documents": ["d"]}


@contextlib.contextmanager
def lifespan_in_thread(app: ScorekitApp) -> Iterator[threading.Event]:
    """Run ``app``'s lifespan (load, warm up, start the engines) in a thread with its own event loop, while the
    block runs; the event yielded is set once the lifespan's start-up is done."""
    started, stop = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    async def run() -> None:
        async with app.lifespan():
            started.set()
            await anyio.to_thread.run_sync(stop.wait)

    def main() -> None:
        try:
            anyio.run(run)
        except BaseException as exc:  # said by the test below, not lost in the thread
            failed.append(exc)

    thread = threading.Thread(target=main, name="lifespan", daemon=True)
    thread.start()
    try:
        yield started
    finally:
        stop.set()
        thread.join(60)
        assert not failed, failed


class HeldWarmUp:
    """The backend's forward, recording each batch's input lengths and holding the first until released."""

    def __init__(self, backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[list[int]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        forward = backend.forward

        def held(batch: Sequence[Encoded]) -> list[torch.Tensor]:
            self.batches.append([len(item.input_ids) for item in batch])
            if len(self.batches) == 1:
                self.entered.set()
                assert self.release.wait(60), "the test never released the warm-up"
            return list(forward(batch))

        monkeypatch.setattr(backend, "forward", held)


def status_of(live: Live, path: str, method: str = "GET") -> int:
    return live.request(method, path)[0]


def readiness(live: Live) -> tuple[int, int, int]:
    """What /readyz, /health and /healthz answer, in that order."""
    return status_of(live, "/readyz"), status_of(live, "/health"), status_of(live, "/healthz")


def not_ready(live: Live) -> None:
    """Readiness says no (with /health), liveness yes, and a scoring request is turned away."""
    assert readiness(live) == (503, 503, 200)
    assert status_of(live, "/readyz", "HEAD") == 503
    status, body = live.json("POST", "/rerank", RERANK)
    assert (status, body["error"]["message"]) == (503, "The model is not ready.")


def test_readyz_is_503_until_the_warm_up_forward_of_the_longest_input_ran_and_while_draining(
    cross_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.for_model(str(cross_encoder_dir), name=MODEL)
    backend = load_models(settings).backends[MODEL]
    held = HeldWarmUp(backend, monkeypatch)
    app = create_app(settings, backends={MODEL: backend})
    with serve(app, lifespan=False) as live:
        not_ready(live)  # nothing loaded yet
        with lifespan_in_thread(app) as started:
            try:
                assert held.entered.wait(60), "the lifespan never ran a warm-up forward"
                not_ready(live)  # loaded, the warm-up running
                assert not started.is_set()
            finally:
                held.release.set()  # a failed check does not leave the lifespan held
            assert started.wait(60)
            assert held.batches == [[backend.max_length]]  # one input, of the longest length the model serves
            assert readiness(live) == (200, 200, 200)
            # The warm-up is counted nowhere: no batch, no request, no item of the worker's.
            samples = scrape(live)
            assert samples.get(("scorekit_batch_size_count", (("model", MODEL),)), 0) == 0
            reranks = {
                dict(labels)["status"]: value
                for (name, labels), value in samples.items()
                if name == "scorekit_requests_total" and ("route", "/rerank") in labels
            }
            assert reranks == {"503": 2}  # the two the test sent before: the warm-up is none
            assert not [name for name, _ in samples if name == "vllm:request_success_total"]
            engine = app.engine
            assert engine is not None and engine.snapshot().worker.batches == 0
            assert live.json("POST", "/rerank", RERANK)[0] == 200
            assert len(held.batches) == 2  # the warm-up's, then the request's own
            app.drain.begin()
            assert readiness(live) == (503, 503, 200)
            _, _, raw = live.request("GET", "/readyz")
            assert b"shutting down" in raw


def test_a_model_host_process_runs_the_warm_up_before_the_server_is_ready(
    cross_encoder_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """With ``--model-host process`` the host runs the warm-up forward where the weights are, before it says it is
    ready: by the time /readyz first answers 200, its line is written (the host logs to the server's stderr)."""
    settings = Settings.for_model(str(cross_encoder_dir), name=MODEL, host="process")
    with serve(create_app(settings)) as live:
        assert status_of(live, "/readyz") == 200
        said = capfd.readouterr().err
    assert re.search(
        rf"scorekit model host: warmed up {re.escape(str(cross_encoder_dir))}: one forward of {MAX_POSITIONS} tokens",
        said,
    )


@pytest.fixture(scope="module", params=SERVERS)
def probed(request: pytest.FixtureRequest, cross_encoder_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(cross_encoder_dir), name=MODEL)), request.param) as live:
        yield live


@pytest.mark.parametrize("path", PROBES)
def test_head_on_a_probe_answers_as_get_without_a_body(probed: Live, path: str) -> None:
    status, headers, body = probed.request("GET", path)
    head_status, head_headers, head_body = probed.request("HEAD", path)
    assert (head_status, head_body) == (status, b"") == (200, b"")
    assert head_headers.get("content-type") == headers.get("content-type")
    if path != "/metrics":  # a scrape counts the one before it: its length moves
        assert head_headers["content-length"] == headers["content-length"] == str(len(body))


def asgi_answer(app: ScorekitApp, method: str, path: str) -> list[dict[str, Any]]:
    """The messages ``app`` sends for one bodiless request, at the ASGI edge (no server in between)."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError  # never: the lifecycle cancels its pump once the answer is sent

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b"", "root_path": ""}
    anyio.run(app, scope, receive, send)
    return sent


def test_head_hands_the_server_no_body_bytes(cross_encoder_dir: Path) -> None:
    """A HEAD answer's body message is empty and its Content-Length the GET answer's: the router strips it, not the
    server (h11 refuses body bytes on a HEAD; others pass them on)."""
    app = create_app(Settings.for_model(str(cross_encoder_dir), name=MODEL))  # no lifespan: /load needs no model
    got, head = asgi_answer(app, "GET", "/load"), asgi_answer(app, "HEAD", "/load")
    assert [message["type"] for message in head] == ["http.response.start", "http.response.body"]
    assert head[0] == got[0] and got[1]["body"] and head[1]["body"] == b""
    assert dict(head[0]["headers"])[b"content-length"] == str(len(got[1]["body"])).encode()


def test_head_is_refused_where_get_is_and_the_405_offers_it(probed: Live) -> None:
    status, headers, body = probed.request("HEAD", "/rerank")
    assert (status, headers["allow"], body) == (405, "POST", b"")
    status, headers, body = probed.request("POST", "/readyz")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    assert re.fullmatch(r'\{"error":\{"message":"Method POST not allowed\.".*"code":405\}\}', body.decode())


ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def cors(cross_encoder_dir: Path) -> Iterator[Live]:
    settings = Settings.for_model(
        str(cross_encoder_dir), name=MODEL, allowed_origins=(ORIGIN,), allowed_methods=("POST",)
    )
    with serve(create_app(settings)) as live:
        yield live


def preflight(live: Live, origin: str, method: str = "POST") -> tuple[int, dict[str, str], Any]:
    headers = {"Origin": origin, "Access-Control-Request-Method": method}
    status, answer, raw = live.request("OPTIONS", "/rerank", headers=headers)
    return status, answer, raw


@pytest.mark.parametrize(
    ("origin", "method", "param", "refused"),
    [
        ("https://evil.example", "POST", "origin", "origin"),
        (ORIGIN, "DELETE", "access-control-request-method", "method"),
        ("https://evil.example", "DELETE", "origin", "origin, method"),
    ],
)
def test_a_refused_cors_preflight_gets_the_json_error_shape(
    cors: Live, origin: str, method: str, param: str, refused: str
) -> None:
    status, headers, raw = preflight(cors, origin, method)
    assert status == 400 and headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(raw)) and headers["vary"].startswith("Origin")
    message = f"CORS preflight refused; not allowed here: {refused}."
    assert raw == (
        b'{"error":{"message":"%s","type":"BadRequestError","param":"%s","code":400}}'
        % (message.encode(), param.encode())
    )


def test_an_allowed_cors_preflight_is_answered_as_before(cors: Live) -> None:
    status, headers, raw = preflight(cors, ORIGIN)
    assert (status, raw, headers["access-control-allow-origin"]) == (200, b"OK", ORIGIN)
