"""Property-test ASGI apps and middleware against scripted fakes of uvicorn, hypercorn and granian.

The ASGI spec leaves room for servers to disagree about ``receive``: how a body is cut into messages,
what two concurrent callers get, whether ``http.disconnect`` is repeated, and what ``receive()`` does
once the response is complete. Code that works on one server can lose a body, hang or double-count on
another. This kit makes those differences reproducible in logical time (no sockets, no sleeps):

- :mod:`scorekit.testing.servers`: the fake servers (:func:`make_server`, :func:`make_scope`), their
  client-side control API and the :class:`Audit` they record;
- :mod:`scorekit.testing.apps`: scripted app behaviours (:class:`BehaviourApp`) that record what an
  app observes, for testing a middleware;
- :mod:`scorekit.testing.driver`: :class:`ClientScript` and the driver (:func:`run_script`,
  :func:`play`, :func:`run_scenario`, :func:`play_scenario`) that plays one against an app;
- :mod:`scorekit.testing.strategies`: Hypothesis strategies for all of the above (needs hypothesis).

See ``docs/testing.md`` for a complete example.
"""

from scorekit.testing import strategies
from scorekit.testing.apps import (
    BEHAVIOUR_KINDS,
    READING_KINDS,
    AppBehaviour,
    AppError,
    AppObservation,
    AppRecorder,
    BehaviourApp,
    BehaviourKind,
    is_final,
    ticks,
)
from scorekit.testing.driver import (
    BACKENDS,
    DISCONNECT_POINTS,
    FINAL_FORMS,
    Backend,
    ClientScript,
    DisconnectPoint,
    FinalForm,
    Outcome,
    Scenario,
    play,
    play_client,
    play_scenario,
    run_scenario,
    run_script,
)
from scorekit.testing.servers import (
    FLAVORS,
    HYPERCORN_QUEUE_SIZE,
    Audit,
    ClientDisconnectedError,
    FakeServer,
    Flavor,
    GranianServer,
    HypercornServer,
    TimelineEvent,
    UvicornServer,
    granian_shared_dicts,
    make_scope,
    make_server,
    reset_granian_shared,
)

__all__ = [
    "BACKENDS",
    "BEHAVIOUR_KINDS",
    "DISCONNECT_POINTS",
    "FINAL_FORMS",
    "FLAVORS",
    "HYPERCORN_QUEUE_SIZE",
    "READING_KINDS",
    "AppBehaviour",
    "AppError",
    "AppObservation",
    "AppRecorder",
    "Audit",
    "Backend",
    "BehaviourApp",
    "BehaviourKind",
    "ClientDisconnectedError",
    "ClientScript",
    "DisconnectPoint",
    "FakeServer",
    "FinalForm",
    "Flavor",
    "GranianServer",
    "HypercornServer",
    "Outcome",
    "Scenario",
    "TimelineEvent",
    "UvicornServer",
    "granian_shared_dicts",
    "is_final",
    "make_scope",
    "make_server",
    "play",
    "play_client",
    "play_scenario",
    "reset_granian_shared",
    "run_scenario",
    "run_script",
    "strategies",
    "ticks",
]
