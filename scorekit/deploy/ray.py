"""scorekit as a Ray Serve deployment: ``create_app(settings)`` built on each replica, behind Ray's proxy.

The only module that imports Ray. :func:`application` is what ``serve run`` or ``serve.run`` takes;
:func:`run` is ``scorekit serve --ray``: it starts Ray (or joins a cluster), deploys, and serves until a
signal. Ray's proxy cancels a replica's request when its client disconnects, and the lifecycle middleware
on the replica turns that into dropped work and a load back to 0 (docs/deployment.md).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import ray
from ray import serve

from scorekit.app import create_app
from scorekit.deploy.options import RayOptions, deployment_options
from scorekit.deploy.replica import ReplicaApp
from scorekit.settings import Settings

logger = logging.getLogger("scorekit.deploy")

STOP_MARGIN = 15.0  # seconds for Serve's own stop beyond the replicas' drain (the shutdown timeout)
# Ray Serve kills a proxy that is not ready within this many seconds (5 by default), and ``serve.start`` then fails
# with the proxy "cancelled before it started running": on a busy machine a new proxy process takes longer than
# that to import. A local instance of scorekit's own waits a minute, as serve.start itself does.
PROXY_READY_CHECK = ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")


class ScorekitReplica:
    """The deployment's class; ``serve.ingress`` adds the ASGI app (as ``self.app``) and Ray's plumbing."""

    def check_health(self) -> None:
        """Ray's periodic health check: raising marks the replica unhealthy, and Ray replaces it."""
        app = getattr(self, "app", None)
        if not isinstance(app, ReplicaApp):
            raise RuntimeError("the scorekit app was not built on this replica")
        problem = app.problem()
        if problem is not None:
            raise RuntimeError(problem)


def replica_app(settings: Settings, options: RayOptions) -> ReplicaApp:
    """Build scorekit's app on a replica; its probe port is the base plus the replica's rank on its node."""
    probe = None
    if options.probe_port is not None:
        rank = serve.get_replica_context().rank
        probe = (options.probe_host, options.probe_port + rank.local_rank)
    return ReplicaApp(create_app(settings), probe)


def application(settings: Settings, options: RayOptions | None = None) -> serve.Application:
    """The bound Ray Serve application: ``serve.run(application(settings))``. Settings pass through unchanged."""
    options = options or RayOptions()

    def build() -> ReplicaApp:  # serve.ingress runs a builder function on each replica, not on the driver
        return replica_app(settings, options)

    ingress = serve.ingress(build)(ScorekitReplica)
    return serve.deployment(ingress, **deployment_options(settings, options)).bind()


def run(settings: Settings, options: RayOptions, *, host: str, port: int, address: str | None) -> int:
    """``scorekit serve --ray``: deploy, serve until SIGINT or SIGTERM, then take the deployment down.

    ``address`` None starts a local Ray instance (and stops it at the end); ``auto`` or ``ray://...`` joins
    a running cluster, where only this application is deleted at the end."""
    local = address is None
    init_ray(address, **({"include_dashboard": False} if local else {}))
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(settings, options), name=options.name, route_prefix="/")
        logger.info("serving on http://%s:%d through Ray Serve (%s)", host, port, _replicas(options))
        _wait_for_signal()
        _stop(options.name, local=local, timeout=settings.shutdown_timeout + STOP_MARGIN)
    finally:
        ray.shutdown()  # a local instance: its processes are stopped too
    return 0


def _stop(name: str, *, local: bool, timeout: float) -> None:
    """Stop Serve (local) or delete the application (cluster), waiting at most ``timeout`` seconds.

    Ray gives each replica up to ``graceful_shutdown_timeout_s`` (the shutdown timeout) for the requests it
    holds. The wait is bounded because a signal sent to the whole process group (systemd's default) also
    stops the local raylet, and Serve then waits for replicas that can no longer answer."""
    done = threading.Event()

    def stop() -> None:
        try:
            if local:
                serve.shutdown()
            else:
                serve.delete(name)
        finally:
            done.set()

    logger.info("stopping: %s", "shutting Ray Serve down" if local else f"deleting the application {name!r}")
    threading.Thread(target=stop, name="ray-serve-stop", daemon=True).start()
    if not done.wait(timeout):
        logger.warning("Ray Serve did not stop within %g s; stopping Ray regardless", timeout)


def _replicas(options: RayOptions) -> str:
    scaling = options.autoscaling
    if scaling is None:
        return f"{options.replicas} replica(s)"
    return f"{scaling.min_replicas} to {scaling.max_replicas} replicas, autoscaled"


def init_ray(address: str | None, **init: Any) -> None:
    """``ray.init``; an instance it starts here (``address`` None or "local") has its processes inherit the proxy's
    wider ready check (:data:`PROXY_READY_CHECK`; a value the environment has wins). A cluster joined keeps its own."""
    if address in (None, "local"):
        os.environ.setdefault(*PROXY_READY_CHECK)
    ray.init(address=address, **init)


def _wait_for_signal() -> None:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    stop.wait()
