"""The audit a fake server keeps: every ``receive``/``send`` call and a shared timeline, for assertions.

Why a separate record: the single-consumer invariants (Q1, Q2, ...) are about *how* ``receive`` was
called (how many tasks at once, whether anyone called after ``http.disconnect``), which neither the app
nor the middleware can report about itself. The fake servers in :mod:`scorekit.testing.servers` write
here; the app-side recorders in :mod:`scorekit.testing.apps` add their ``app.*`` events to the same
timeline, so a test can relate what the client did, what the server handed out and what the app saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scorekit.asgi import Message


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One step in a request's life, in the order it happened.

    ``kind`` is namespaced by who acted: ``client.*`` (the scripted peer), ``server.*`` (the fake's
    receive/send), ``app.*`` (written by :class:`scorekit.testing.apps.AppRecorder`). ``tick`` is the
    driver's logical clock when the event happened (0 outside :func:`scorekit.testing.run_script`).
    """

    kind: str
    tick: int
    message: Message | None = None
    consumer: int | None = None
    data: bytes | None = None


@dataclass
class Audit:
    """What the fake server saw, for asserting single-consumer and transparency invariants.

    ``max_in_flight`` counts tasks inside ``receive()`` at once (suspended or not) and ``max_waiting``
    the ones suspended in it: both must stay at 1 behind a correct lifecycle layer (Q1).
    ``calls_after_disconnect`` counts ``receive()`` calls made after the server had returned
    ``http.disconnect`` once (Q2). ``delivered`` and ``sent`` hold the very message objects that went
    through ``receive`` and ``send`` (so identity checks work), in order.
    """

    receive_calls: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    waiting: int = 0
    max_waiting: int = 0
    calls_after_disconnect: int = 0
    disconnect_delivered: bool = False
    send_errors: int = 0
    delivered: list[Message] = field(default_factory=list)
    sent: list[Message] = field(default_factory=list)
    timeline: list[TimelineEvent] = field(default_factory=list)
    tick: int = 0

    def note(
        self,
        kind: str,
        *,
        message: Message | None = None,
        consumer: int | None = None,
        data: bytes | None = None,
    ) -> None:
        """Append an event stamped with the current logical tick."""
        self.timeline.append(TimelineEvent(kind, self.tick, message, consumer, data))

    def events(self, kind: str) -> list[TimelineEvent]:
        """The events of one kind, in order."""
        return [event for event in self.timeline if event.kind == kind]

    def index_of(self, kind: str) -> int | None:
        """Position of the first event of ``kind`` in the timeline, or None."""
        for index, event in enumerate(self.timeline):
            if event.kind == kind:
                return index
        return None

    @property
    def delivered_body(self) -> bytes:
        """The body bytes the server handed out through ``receive()`` (all consumers, in order)."""
        return b"".join(m.get("body", b"") for m in self.delivered if m.get("type") == "http.request")

    def enter_wait(self) -> None:
        """A task suspends inside ``receive()`` (the fakes call this around their waits)."""
        self.waiting += 1
        self.max_waiting = max(self.max_waiting, self.waiting)

    def exit_wait(self) -> None:
        """The suspended task resumed, with a message or cancelled."""
        self.waiting -= 1
