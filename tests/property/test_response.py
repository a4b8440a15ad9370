"""P1-P2: response completion is detected for every terminal form; sends are forwarded unchanged."""

from __future__ import annotations

from typing import Literal

import anyio
import anyio.lowlevel
from hypothesis import given
from hypothesis import strategies as st

from scorekit.asgi import Message, Receive, Scope, Send
from scorekit.lifecycle import LifecycleMiddleware, lifecycle_of
from scorekit.testing import AsyncBackend, ClientScript, Flavor, make_server, run_script
from scorekit.testing.apps import AppRecorder, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.servers import ClientDisconnectedError
from scorekit.testing.strategies import client_scripts

from .conftest import PROPERTY, each_backend, each_flavor, request_ended, run

Form = Literal["body", "body_default", "trailers", "pathsend", "zerocopysend"]
FORMS: tuple[Form, ...] = ("body", "body_default", "trailers", "pathsend", "zerocopysend")


def response_messages(form: Form, lead: int, trailer_parts: int) -> list[Message]:
    """A complete response in ``form``: the last message is the (only) terminal one."""
    start: Message = {"type": "http.response.start", "status": 200, "headers": []}
    if form == "trailers":
        start["trailers"] = True
    messages = [start]
    if form == "zerocopysend":
        messages += [{"type": "http.response.zerocopysend", "file": 3, "more_body": True} for _ in range(lead)]
        return [*messages, {"type": "http.response.zerocopysend", "file": 3, "more_body": False}]
    messages += [{"type": "http.response.body", "body": b"part", "more_body": True} for _ in range(lead)]
    if form == "body":
        return [*messages, {"type": "http.response.body", "body": b"end", "more_body": False}]
    if form == "body_default":
        return [*messages, {"type": "http.response.body", "body": b"end"}]  # more_body defaults to False
    if form == "pathsend":
        return [start, {"type": "http.response.pathsend", "path": "/srv/file.bin"}]
    messages.append({"type": "http.response.body", "body": b"end", "more_body": False})  # not terminal yet
    messages += [{"type": "http.response.trailers", "headers": [], "more_trailers": True}] * trailer_parts
    return [*messages, {"type": "http.response.trailers", "headers": [], "more_trailers": False}]


class FormApp:
    """Reads the body, sends one response form (or all but its terminal message), then keeps working."""

    def __init__(self, audit: Audit, messages: list[Message], truncate: bool, work: int) -> None:
        self.recorder = AppRecorder(audit)
        self.messages = messages[:-1] if truncate else messages
        self.truncate = truncate
        self.work = work
        self.complete_before: list[bool] = []
        self.lifecycle: object = None
        self.cancelled = False
        self.work_done = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        assert lifecycle is not None
        self.lifecycle = lifecycle
        try:
            await self.recorder.read_to_end(receive)
            for message in self.messages:
                self.complete_before.append(lifecycle.response_complete)
                await send(message)
            if self.truncate:
                await anyio.sleep_forever()  # only the client's disconnect can end this
            await ticks(self.work)
            self.work_done = True
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise


@each_flavor
@each_backend
@PROPERTY
@given(
    form=st.sampled_from(FORMS),
    lead=st.integers(0, 3),
    trailer_parts=st.integers(0, 2),
    truncate=st.booleans(),
    work=st.integers(0, 20),
    data=st.data(),
)
def test_P1_every_terminal_form_completes(
    flavor: Flavor,
    backend: AsyncBackend,
    form: Form,
    lead: int,
    trailer_parts: int,
    truncate: bool,
    work: int,
    data: st.DataObject,
) -> None:
    """Final body, last trailers, pathsend and zerocopysend(more_body=False) each complete the response:
    a disconnect after it cancels nothing; one before it (the form minus its last message) cancels."""
    script = data.draw(client_scripts(disconnects=("none",)))
    messages = response_messages(form, lead, trailer_parts)
    server = make_server(flavor)
    sends = len(messages) - 1 if truncate else len(messages)
    server.disconnect_after_send(sends)  # the client leaves right after the app's last message
    app = FormApp(server.audit, messages, truncate, work)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app), script, server=server)
        assert not outcome.hung
        assert request_ended(outcome)

    run(backend, main)
    assert app.complete_before == [False] * len(app.messages)
    complete_after = getattr(app.lifecycle, "response_complete", None)
    if truncate:
        assert complete_after is False
        assert app.cancelled
    else:
        assert complete_after is True
        assert server.response_complete
        assert not app.cancelled
        assert app.work_done


class Sender:
    """Sends a drawn message sequence; stops at the first OSError from send (kept as ``error``)."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.attempted: list[Message] = []
        self.error: OSError | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        for message in self.messages:
            self.attempted.append(message)
            try:
                await send(message)
            except OSError as exc:
                self.error = exc
                return
            await anyio.lowlevel.checkpoint()


@st.composite
def message_sequences(draw: st.DrawFn) -> list[Message]:
    """start, body chunks (some with extra keys), optional early hint and debug messages, final body."""
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append({"type": "http.response.early_hint", "links": [b"</a.css>; rel=preload"]})
    messages.append({"type": "http.response.start", "status": draw(st.sampled_from([200, 201, 404])), "headers": []})
    for body in draw(st.lists(st.binary(max_size=16), max_size=5)):
        message: Message = {"type": "http.response.body", "body": body, "more_body": True}
        if draw(st.booleans()):
            message["x-extra"] = draw(st.integers())  # unknown keys must survive too
        messages.append(message)
        if draw(st.booleans()):
            messages.append({"type": "http.response.debug", "info": {"n": len(messages)}})
    messages.append({"type": "http.response.body", "body": b"", "more_body": False})
    return messages


@each_flavor
@each_backend
@PROPERTY
@given(
    messages=message_sequences(),
    spec24=st.booleans(),
    leave_after=st.none() | st.integers(1, 8),
    layers=st.integers(1, 2),
)
def test_P2_sends_forwarded_unchanged(
    flavor: Flavor, backend: AsyncBackend, messages: list[Message], spec24: bool, leave_after: int | None, layers: int
) -> None:
    """Every message the app sends reaches the server unchanged (same object) and in order, until the
    server raises; the server's OSError reaches the app unchanged."""
    server = make_server(flavor, raise_on_send_after_disconnect=spec24)
    if leave_after is not None:
        server.disconnect_after_send(leave_after)
    sender = Sender(messages)
    app = sender
    stack = LifecycleMiddleware(app)
    for _ in range(layers - 1):
        stack = LifecycleMiddleware(stack)

    async def main() -> None:
        script = ClientScript(method="GET")
        outcome = await run_script(stack, script, server=server)
        assert not outcome.hung

    run(backend, main)
    assert len(server.audit.sent) == len(sender.attempted)
    assert all(a is b for a, b in zip(server.audit.sent, sender.attempted, strict=True))
    assert sender.attempted == messages[: len(sender.attempted)]
    if sender.error is not None:
        assert isinstance(sender.error, ClientDisconnectedError)
        assert spec24
    if leave_after is None:
        assert sender.attempted == messages
