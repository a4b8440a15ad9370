"""``scorekit serve``: the app under uvicorn. Each flag also reads ``SCOREKIT_<FLAG>`` from the env."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

# Before torch loads: OpenMP threads that spin at barriers starve the event loop on small or shared
# CPUs (docs/benchmarks.md measured 2.6x-20x slower forwards). An explicit setting still wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from scorekit.app import create_app
from scorekit.serving import run_server
from scorekit.settings import EngineConfig, Settings

_ENGINE = EngineConfig()
_SETTINGS = Settings()


def _flag(
    parser: argparse.ArgumentParser,
    name: str,
    cast: Callable[[str], Any],
    default: Any,
    text: str,
    **extra: Any,
) -> None:
    env = "SCOREKIT_" + name.upper().replace("-", "_")
    value = os.environ.get(env)
    parser.add_argument(
        f"--{name}",
        type=cast,
        default=cast(value) if value is not None else default,
        help=f"{text} (env {env}; default: %(default)s)",
        **extra,
    )


def _at_least(low: float, cast: Callable[[str], Any]) -> Callable[[str], Any]:
    """``cast``, refusing values below ``low`` with one line from argparse."""

    def parse(text: str) -> Any:
        value = cast(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, not {text}")
        return value

    parse.__name__ = cast.__name__  # argparse names the type in its "invalid int value" message
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scorekit", description="A scoring server for rerankers and scorers.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Serve a model over HTTP (default: the embedded all-MiniLM-L6-v2).")
    _flag(serve, "model", str, None, "A local model folder or a hub name")
    _flag(serve, "served-model-name", str, None, "The name clients use in `model` fields")
    _flag(
        serve,
        "model-kind",
        str,
        None,
        "Override detection",
        choices=["cross-encoder", "bi-encoder", "causal-lm"],
    )
    _flag(serve, "host", str, "127.0.0.1", "Interface to bind")
    _flag(serve, "port", int, 8000, "Port to bind")
    _flag(serve, "device", str, _SETTINGS.device, "torch device: cpu, cuda, cuda:1")
    _flag(serve, "dtype", str, _SETTINGS.dtype, "auto, float32, float16 or bfloat16")
    _flag(serve, "max-batch-tokens", int, _ENGINE.max_batch_tokens, "Padded tokens per model batch")
    _flag(serve, "max-batch-size", int, _ENGINE.max_batch_size, "Items per model batch")
    _flag(serve, "max-queued-items", int, _ENGINE.max_queued_items, "Queued items before new requests get 503")
    _flag(
        serve,
        "max-concurrent-requests",
        int,
        _ENGINE.max_concurrent_requests,
        "Requests in flight before 503",
    )
    _flag(serve, "max-body-bytes", int, _SETTINGS.max_body_bytes, "Largest request body (413 above)")
    _flag(
        serve,
        "max-items-per-request",
        int,
        _SETTINGS.max_items_per_request,
        "Most documents/items per request",
    )
    _flag(
        serve,
        "shutdown-timeout",
        float,
        _SETTINGS.shutdown_timeout,
        "Seconds in-flight requests get on SIGTERM",
    )
    _flag(
        serve,
        "limit-concurrency",
        _at_least(0, int),
        _SETTINGS.limit_concurrency,
        "Most open connections; past it the oldest one yet to send a request head is closed. 0: the"
        " open-file limit less a reserve",
    )
    _flag(
        serve,
        "header-timeout",
        _at_least(0.001, float),
        _SETTINGS.header_timeout,
        "Seconds a connection gets to send its request head before it is closed",
    )
    _flag(serve, "log-level", str, "info", "debug logs one line per batch", choices=["debug", "info", "warning"])
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        model=args.model,
        served_model_name=args.served_model_name,
        kind=args.model_kind,
        device=args.device,
        dtype=args.dtype,
        engine=EngineConfig(
            max_batch_tokens=args.max_batch_tokens,
            max_batch_size=args.max_batch_size,
            max_queued_items=args.max_queued_items,
            max_concurrent_requests=args.max_concurrent_requests,
        ),
        max_body_bytes=args.max_body_bytes,
        max_items_per_request=args.max_items_per_request,
        shutdown_timeout=args.shutdown_timeout,
        limit_concurrency=args.limit_concurrency,
        header_timeout=args.header_timeout,
    )


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings_from(args))
    return run_server(app, host=args.host, port=args.port, log_level=args.log_level)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
