"""``create_app``: the ASGI app and its lifespan.

The stack, outermost first: LifecycleMiddleware → InFlight → RequestMetrics → Traces (with an OTLP endpoint) → CORS
(``allowed_origins``) → Usage (the request's ticket) → ApiKeyGate (``api_keys``) → the caller's ``middleware`` →
DrainGate → Router → endpoints (see :mod:`scorekit.middleware`).

The lifespan loads every served model and starts one engine (batcher and worker thread) per model. A host
app that mounts scorekit (Starlette and FastAPI do not run a mounted app's lifespan) composes
:meth:`ScorekitApp.lifespan` into its own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread
from starlette.middleware import Middleware

from scorekit import __version__
from scorekit.api.errors import as_http_error
from scorekit.api.openapi import build_openapi
from scorekit.api.routes import ROUTES
from scorekit.api.state import ServerState
from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.engine import Engine
from scorekit.lifecycle import LifecycleMiddleware
from scorekit.load import Board, Cell, LoadCounter
from scorekit.logs import ensure_visible
from scorekit.metrics import Metrics, ModelGauge
from scorekit.middleware.access import access_line
from scorekit.middleware.auth import ApiKeyGate
from scorekit.middleware.cors import JsonCORS
from scorekit.middleware.drain import Drain, DrainGate, InFlight
from scorekit.middleware.metrics import RequestEnd, RequestMetrics
from scorekit.middleware.tracing import Traces
from scorekit.middleware.usage import Usage
from scorekit.model_host import Card, warm_up
from scorekit.models import PairScorer, load_spec
from scorekit.models.base import Backend
from scorekit.models.budget import TokenBudget, token_budgets
from scorekit.registry import ModelRegistry
from scorekit.routing import Alias, Route, Router
from scorekit.settings import ModelSpec, Settings
from scorekit.tracing import TraceConfig, Tracing

if TYPE_CHECKING:
    from scorekit.host.client import HostClient

logger = logging.getLogger("scorekit.app")


class ScorekitApp:
    """The whole scorekit stack as one ASGI app."""

    def __init__(
        self,
        settings: Settings,
        *,
        backends: Mapping[str, Backend] | None = None,
        routes: Iterable[Route | Alias] = ROUTES,
        middleware: Sequence[Middleware] = (),
        group: FrontEndGroup | None = None,
    ) -> None:
        self.settings = settings
        self._backends = dict(backends or {})  # loaded already (by `scorekit serve`), keyed by served name
        self._group = group
        table = tuple(routes)
        self.load = LoadCounter(None if group is None else group.board)
        self.models = ModelRegistry(settings.models)
        self.metrics = Metrics(
            self.load, models=self._model_gauges, processes=None if group is None else group.metrics_dir
        )
        # Begun by the server process at its first signal, which cuts what is left at the drain's deadline.
        self.drain = Drain()
        # The model host processes by served name: started by `scorekit serve` before it serves, else by the lifespan.
        self._hosts: dict[str, HostClient] = {}
        self.state = ServerState(
            settings=settings,
            models=self.models,
            load=self.load,
            metrics=self.metrics,
            draining=lambda: self.drain.draining,
            openapi=build_openapi(table, title="scorekit", version=__version__),
        )
        router = Router(
            table,
            state=self.state,
            max_body_bytes=settings.max_body_bytes,
            errors=as_http_error,
        )
        stack: ASGIApp = DrainGate(router, drain=self.drain, route_of=router.route_of)
        for cls, args, kwargs in reversed(middleware):
            stack = cls(stack, *args, **kwargs)
        if settings.api_keys:
            board = None if group is None else group.board  # the quotas hold over every front end
            stack = ApiKeyGate(stack, keys=settings.keys, route_of=router.route_of, board=board)
        stack = Usage(stack)
        if settings.allowed_origins:
            stack = JsonCORS(
                stack,
                allow_origins=settings.allowed_origins,
                allow_methods=settings.allowed_methods,
                allow_headers=settings.allowed_headers,
                allow_credentials=settings.allow_credentials,
            )
        traces = TraceConfig.resolve(settings)
        self.tracing = None if traces is None else Tracing(traces)
        if self.tracing is not None:
            stack = Traces(stack, tracing=self.tracing, route_of=router.route_of)
        ended: list[RequestEnd] = [self.metrics.request_ended]
        if settings.access_log:
            ended.append(access_line)
        stack = RequestMetrics(stack, route_of=router.route_of, observe=self.metrics.observe_request, ended=ended)
        self._stack = LifecycleMiddleware(InFlight(stack, drain=self.drain), load=self.load)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(self.lifespan, receive, send)
        else:
            await self._stack(scope, receive, send)

    @property
    def engine(self) -> Engine | None:
        """The default model's engine (the first served model); None before it loads."""
        return self.models.get(self.models.default)

    @asynccontextmanager
    async def lifespan(self, _host: object = None) -> AsyncIterator[None]:
        """Load every model and run its worker for the duration; usable as Starlette's ``lifespan=``.

        Models load one after another (each load already uses every core), all of them before any engine
        starts, since a budget sized for a GPU depends on what every model left free there; a model that fails
        to load or start stops the ones started before it."""
        ensure_visible()  # before the models load: their load lines are part of the start-up log too
        loaded = await anyio.to_thread.run_sync(load_models, self.settings, self._backends)
        async with AsyncExitStack() as stack:
            if self.tracing is not None:  # the last requests' spans go out before the server's process ends
                stack.push_async_callback(anyio.to_thread.run_sync, self.tracing.flush)
            for spec in self.settings.models:
                name = spec.served_name
                backend, budget = loaded.backends[name], loaded.budgets.get(name)
                engine = await anyio.to_thread.run_sync(self._start_engine, name, backend, spec, budget)
                stack.push_async_callback(self._stop_engine, name, engine)
            yield

    def start_hosts(self) -> None:
        """Start the model host process of every model served with ``host`` "process" and wait until each has
        loaded its model: ``scorekit serve`` calls it before it serves, so a host that cannot load is its one line
        (:class:`~scorekit.host.client.HostStartError`) and no port answers; the lifespan starts those not started.
        Blocking; a host that fails stops the ones started before it."""
        try:
            for spec in self.settings.models:
                if spec.host == "process" and spec.served_name not in self._hosts:
                    self._start_host(spec)
        except BaseException:
            for name in list(self._hosts):
                self._hosts.pop(name).stop(self.settings.shutdown_timeout)
            raise

    def _start_host(self, spec: ModelSpec) -> HostClient:
        from scorekit.host.client import HostClient  # the wire and its process only where asked for

        name = spec.served_name
        observer = self.metrics.model(name)
        if self._group is None:
            client = HostClient(spec, observer=observer)
        else:  # the supervisor's host, which every front end joins; its queue is counted on the board
            cells = (self.load.cell(f"queued_items:{name}"), self.load.cell(f"queued_tokens:{name}"))
            requests = (self.load.cell(f"waiting:{name}"), self.load.cell(f"running:{name}"))
            client = HostClient(
                spec, observer=observer, address=self._group.hosts[name], cells=cells, request_cells=requests
            )
        client.start()  # blocks until the host has loaded the model (or raises its one-line error)
        self._hosts[name] = client
        return client

    def dead_host(self) -> str | None:
        """The first model host process that died while serving, as one line naming its model and its exit status
        (the server's drain waits for nothing it holds: its jobs have failed); None while every host lives."""
        return next((line for client in self._hosts.values() if (line := client.death_line) is not None), None)

    def _start_engine(self, name: str, backend: Backend, spec: ModelSpec, budget: TokenBudget | None) -> Engine:
        """Start the model's engine: its batches run in this process, or (``spec.host`` "process") in a model
        host process, which sizes their budget itself and whose card must be this server's copy's."""
        observer = self.metrics.model(name)
        if spec.host == "process":
            client = self._hosts.get(name) or self._start_host(spec)
            engine = Engine(backend, spec.engine, observer=observer, host=client, admitted=self._admitted(name))
            try:
                budget = checked_host(name, engine.card, client.card, client.budget)
            except ValueError:
                self._hosts.pop(name, None)
                engine.stop(self.settings.shutdown_timeout)
                raise
        else:
            assert budget is not None, "load_models sizes every in-process model's batches"
            config = replace(spec.engine, max_batch_tokens=budget.tokens)
            engine = Engine(backend, config, observer=observer, admitted=self._admitted(name))
            warm_up(backend, budget.tokens)  # before the registry has the engine: /readyz is 503 until it ran
            engine.start()
        card = engine.card
        logger.info(
            "scorekit %s serving %s (%s, inputs up to %d tokens) as %r; batches of up to %d padded tokens (%s)",
            __version__,
            card.name,
            card.kind,
            card.max_length,
            name,
            budget.tokens,
            budget.source,
        )
        self.models.add(name, engine)
        return engine

    def _admitted(self, name: str) -> Cell:
        """Where the model's engine counts the requests it admitted: over every front end of a group."""
        return self.load.cell(f"admitted:{name}")

    async def _stop_engine(self, name: str, engine: Engine) -> None:
        self.models.remove(name)
        self._hosts.pop(name, None)  # the engine stops it
        await anyio.to_thread.run_sync(engine.stop, self.settings.shutdown_timeout)

    def _model_gauges(self) -> Iterator[ModelGauge]:
        for served in self.models:
            engine = served.engine
            if engine is None:
                yield ModelGauge(served.name, 0, 0, 0)
            else:
                items, tokens = engine.queue()  # never a round trip to a model host: /metrics is on the event loop
                waiting, running = engine.requests()
                yield ModelGauge(served.name, items, tokens, engine.active_requests, waiting, running)


async def serve_lifespan(
    lifespan: Callable[[], AbstractAsyncContextManager[None]], receive: Receive, send: Send
) -> None:
    """Answer an ASGI server's lifespan messages with ``lifespan`` (startup on entry, shutdown on exit); a
    failure is the server's ``lifespan.*.failed`` with one line, and logged with its traceback."""
    await receive()  # lifespan.startup
    started = False
    try:
        async with lifespan():
            started = True
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
    except Exception as exc:
        logger.exception("lifespan failed")
        phase = "shutdown" if started else "startup"
        await send({"type": f"lifespan.{phase}.failed", "message": f"{type(exc).__name__}: {exc}"})
        return
    await send({"type": "lifespan.shutdown.complete"})


def create_app(
    settings: Settings | None = None,
    *,
    backends: Mapping[str, Backend] | None = None,
    routes: Iterable[Route | Alias] = ROUTES,
    middleware: Sequence[Middleware] = (),
) -> ScorekitApp:
    """The embedding entry point: an ASGI app for ``settings`` (default: the embedded MiniLM model).

    ``backends`` are models loaded already, by served name; the lifespan loads the others. ``middleware``
    (Starlette's ``Middleware(cls, *args, **kwargs)``, outermost first) sit under the lifecycle
    middleware, which stays the only reader of the server's ``receive``, and under the request metrics,
    which count what they answer; the drain gate and the router are below them, so a CORS middleware also
    dresses a draining server's 503."""
    return ScorekitApp(settings or Settings(), backends=backends, routes=routes, middleware=middleware)


@dataclass(frozen=True, slots=True)
class FrontEndGroup:
    """What a front end of several (``--api-processes N``) shares with the others, from its supervisor: the load
    board it counts on (its own row), the Prometheus directory every front end writes its metrics to, and the
    address each model's host process takes front ends at, by served name."""

    board: Board
    metrics_dir: Path
    hosts: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class LoadedModels:
    """Every served model loaded and checked, by served name, with its batches' token budget (but a model in a
    model host process, whose host sizes its budget and tells it when ready)."""

    backends: Mapping[str, Backend]
    budgets: Mapping[str, TokenBudget]


def load_models(settings: Settings, loaded: Mapping[str, Backend] | None = None) -> LoadedModels:
    """Every model ``settings`` serves, loaded one after another (but those in ``loaded``, by served name), checked
    against the settings, with its batches' token budget: all that start-up can refuse once the models are known.
    ``scorekit serve`` calls it to refuse in one line before it serves, the lifespan for whatever is not loaded
    yet. Blocking (weights load; on a GPU a probe batch runs, once per model): call it off the event loop. A model
    hosted in a process of its own (``host`` "process") loads here without weights (its plans, tokenizer and card);
    its host process loads the weights when its engine starts.

    A runtime that cannot serve the kind a model turned out to be raises :class:`~scorekit.choices.UnfitRuntime`."""
    backends = dict(loaded or {})
    for spec in settings.models:
        name = spec.served_name
        if name not in backends:
            backends[name] = load_spec(spec, weights=spec.host == "thread")
        check_long_documents(settings, name, backends[name])
    return LoadedModels(backends, token_budgets(settings.models, backends))


def check_long_documents(settings: Settings, name: str, backend: Backend) -> None:
    """With ``long_documents="chunk"``, every pair scorer served must be able to chunk (a bi-encoder cannot),
    or each of its requests would be refused."""
    if settings.long_documents == "chunk" and isinstance(backend, PairScorer) and not backend.chunks_documents:
        raise ValueError(
            f"Long documents are chunked by default, but model {name!r} is a {backend.kind}, which cannot "
            "score a document by windows: serve it without --long-documents chunk."
        )


def checked_host(name: str, card: Card, hosted: Card, budget: TokenBudget) -> TokenBudget:
    """The budget a model host process sized, once the model it loaded is the one this server plans for: the
    same name, kind and longest input, or the server would tokenize for another model than the one that runs."""
    if hosted != card:
        raise ValueError(
            f"Model {name!r}: its host process loaded {hosted.name} ({hosted.kind}, inputs up to"
            f" {hosted.max_length} tokens), but this server plans for {card.name} ({card.kind}, inputs up to"
            f" {card.max_length} tokens)."
        )
    return budget
