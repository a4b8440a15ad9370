"""How a Ray Serve deployment of scorekit is sized: replicas, autoscaling, devices, and the request caps.

Ray Serve's defaults fight a batching server: ``max_ongoing_requests`` is 5, so a replica never holds
enough requests to fill a batch, and autoscaling aims at 2 requests per replica. Here the cap comes from
the engine's own admission limit (Ray then queues past it instead of the engine answering 503), and the
autoscaling target from a batch's worth of requests, kept below the cap so a replica has headroom while
another starts. This module imports no Ray: the CLI checks its flags with it (:meth:`RayOptions.from_flags`)
before Ray loads.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from scorekit.settings import Settings

# The flags of scorekit's own server that Ray's proxy, which takes the connections, would ignore.
NOT_ON_RAY = ("limit-concurrency", "header-timeout")


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """Ray Serve autoscaling between ``min_replicas`` and ``max_replicas``; ``target_ongoing_requests``
    None: a batch's worth of requests (see :func:`target_ongoing_requests`)."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_ongoing_requests: int | None = None

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError(
                f"autoscaling needs 0 <= min_replicas <= max_replicas and max_replicas >= 1,"
                f" not {self.min_replicas} and {self.max_replicas}"
            )
        if self.target_ongoing_requests is not None and self.target_ongoing_requests < 1:
            raise ValueError(f"target_ongoing_requests must be at least 1, not {self.target_ongoing_requests}")


@dataclass(frozen=True, slots=True)
class RayOptions:
    """One scorekit deployment on Ray Serve. ``replicas`` is a fixed count, unless ``autoscaling`` is set.

    ``num_gpus`` per replica (Ray gives each its own and sets ``CUDA_VISIBLE_DEVICES``, so the settings'
    device is ``cuda``); ``num_cpus`` per replica. ``probe_port``: each replica also serves ``/health``,
    ``/load`` and ``/metrics`` on ``probe_host`` at ``probe_port`` plus its rank on its node (0, 1, ...),
    since through Ray's proxy those answer from whichever replica the request lands on. None: no probe port.
    """

    replicas: int = 1
    autoscaling: Autoscaling | None = None
    num_gpus: float = 0
    num_cpus: float = 1
    max_ongoing_requests: int | None = None  # None: the engines' max_concurrent_requests
    probe_host: str = "127.0.0.1"
    probe_port: int | None = None
    name: str = "scorekit"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, not {self.replicas}")
        if self.num_gpus < 0 or self.num_cpus < 0:
            raise ValueError("num_gpus and num_cpus must be 0 or more")
        if self.max_ongoing_requests is not None and self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be at least 1, not {self.max_ongoing_requests}")
        if self.probe_port is not None and not 1 <= self.probe_port <= 65535:
            raise ValueError(f"probe_port must be a port number, not {self.probe_port}")

    @classmethod
    def from_flags(
        cls,
        settings: Settings,
        *,
        given: Collection[str],
        replicas: int,
        min_replicas: int | None,
        max_replicas: int | None,
        target_ongoing: int | None,
        max_ongoing: int | None,
        num_gpus: float,
        num_cpus: float,
        probe_host: str,
        probe_port: int | None,
    ) -> RayOptions:
        """``scorekit serve --ray``'s flags as options for ``settings``, with every combination Ray would refuse,
        or silently ignore, refused as a ValueError in the flags' words. ``given``: the flags the user set (on the
        command line or in the environment), by name: some are refused when set at all, even to their default;
        ``target_ongoing`` and ``max_ongoing`` are the requests per replica (None: sized from the engines)."""
        if ignored := [name for name in NOT_ON_RAY if name in given]:
            raise ValueError(
                f"--{ignored[0]} limits scorekit's own server; with --ray, Ray's proxy takes the connections"
            )
        devices = {spec.device for spec in settings.models}
        if any(device.startswith("cuda:") for device in devices):
            raise ValueError("--device cuda:N picks one GPU, but Ray gives each replica its own: use --device cuda")
        if num_gpus > 0 and devices != {"cuda"}:
            raise ValueError("--num-gpus gives each replica a GPU: add --device cuda")
        scaling = {"min-replicas", "target-ongoing-requests"} & set(given)
        if scaling and max_replicas is None:
            raise ValueError(f"--{sorted(scaling)[0]} autoscales: add --max-replicas")
        if max_replicas is not None and "replicas" in given:
            raise ValueError("--replicas is a fixed count and --max-replicas autoscales: give one of them")
        low = 1 if min_replicas is None else min_replicas
        if max_replicas is not None and low > max_replicas:
            raise ValueError(f"--min-replicas ({low}) is above --max-replicas ({max_replicas})")
        autoscaling = None if max_replicas is None else Autoscaling(low, max_replicas, target_ongoing)
        options = cls(
            replicas=replicas,
            autoscaling=autoscaling,
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            max_ongoing_requests=max_ongoing,
            probe_host=probe_host,
            probe_port=probe_port,
        )
        target, cap = target_ongoing_requests(settings, options), max_ongoing_requests(settings, options)
        if autoscaling is not None and target >= cap:
            raise ValueError(
                f"--target-ongoing-requests ({target}) must be below --max-ongoing-requests"
                f" ({cap}, by default --max-concurrent-requests)"
            )
        return options


def max_ongoing_requests(settings: Settings, options: RayOptions) -> int:
    """Requests Ray sends one replica at once: the smallest engine admission limit, so that no engine answers
    503 for a request Ray could have queued (Ray's default, 5, would starve the batcher)."""
    if options.max_ongoing_requests is not None:
        return options.max_ongoing_requests
    return min(spec.engine.max_concurrent_requests for spec in settings.models)


def target_ongoing_requests(settings: Settings, options: RayOptions) -> int:
    """The autoscaling target per replica: a full batch of one-document requests keeps a replica busy, so
    more than that in flight is the signal to add one; at most half the cap, so Ray scales before it queues."""
    if options.autoscaling is not None and options.autoscaling.target_ongoing_requests is not None:
        return options.autoscaling.target_ongoing_requests
    batch = max(spec.engine.max_batch_size for spec in settings.models)
    return max(1, min(batch, max_ongoing_requests(settings, options) // 2))


def deployment_options(settings: Settings, options: RayOptions) -> dict[str, Any]:
    """Keyword arguments for ``ray.serve.deployment``."""
    auto = [spec for spec in settings.models if spec.engine.max_batch_tokens is None]
    if 0 < options.num_gpus < 1 and any(spec.device.startswith("cuda") for spec in auto):
        # Each replica would size its batches for the GPU's free memory as if it were alone on it.
        raise ValueError(
            f"--num-gpus {options.num_gpus:g} puts several replicas on one GPU, and --max-batch-tokens auto sizes"
            " each one's batches as if it were alone there: give --max-batch-tokens N"
        )
    cap = max_ongoing_requests(settings, options)
    found: dict[str, Any] = {
        "name": options.name,
        "max_ongoing_requests": cap,
        "ray_actor_options": {"num_cpus": options.num_cpus, "num_gpus": options.num_gpus},
        # Ray's wait for a stopping replica's requests: scorekit's own drain deadline.
        "graceful_shutdown_timeout_s": settings.shutdown_timeout,
    }
    scaling = options.autoscaling
    if scaling is None:
        found["num_replicas"] = options.replicas
    else:
        target = target_ongoing_requests(settings, options)
        if target >= cap:
            raise ValueError(f"target_ongoing_requests ({target}) must be below max_ongoing_requests ({cap})")
        found["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "initial_replicas": max(1, scaling.min_replicas),
            "target_ongoing_requests": target,
        }
    return found
