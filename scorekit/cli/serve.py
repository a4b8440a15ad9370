"""``scorekit serve`` itself: the models loaded (:func:`scorekit.app.load_models`, as the app's lifespan would),
then served by uvicorn or deployed on Ray Serve; every start-up error one line on stderr."""

from __future__ import annotations

import argparse
import logging.config
import os
import socket
import sys
from typing import NoReturn

from scorekit.choices import UnfitRuntime, local_model
from scorekit.cli.flags import error_line, usage_error
from scorekit.connections import bind_listener
from scorekit.logs import handed_down, process_config, route_transformers


def serve(args: argparse.Namespace) -> int:
    """Load the models, then serve them until a signal ends the drain. A start-up error is one line and exit 1
    (2 for a runtime that cannot serve the kind a model turned out to be: a usage error found late)."""
    settings = args.settings
    try:
        for spec in settings.models:
            if spec.path is not None:
                local_model(spec.path)  # a missing folder: said at once, before torch loads
        sock = bind_listener(args.host, args.port, reuse_port=args.api_processes > 1)  # a busy port too, now
        # Several front ends: a socket each, bound now beside the first (the kernel spreads connections over them).
        socks = [sock, *(bind_listener(args.host, args.port, reuse_port=True) for _ in range(args.api_processes - 1))]
    except ValueError as exc:
        _fail(exc, args.debug)
    config = process_config(args.log_level, args.log_format)
    logging.config.dictConfig(config)
    handed_down(args.log_format)  # the front ends and model hosts it starts log in it too
    # The heavy imports (torch, transformers, uvicorn) come only now that the flags are good.
    from scorekit.app import create_app, load_models
    from scorekit.host.client import HostStartError
    from scorekit.serving import run_server

    route_transformers(args.log_level)
    if args.ray_options is not None:
        return _serve_on_ray(args, sock)
    try:
        loaded = load_models(settings)
    except KeyboardInterrupt:
        return 130
    except UnfitRuntime as exc:
        usage_error("scorekit serve", f"{exc} (model {exc.model!r} is a {exc.kind})")
    except Exception as exc:
        _fail(exc, args.debug)
    if args.api_processes > 1:  # the models were loaded without weights to check them: the hosts load them
        from scorekit.cli.supervisor import supervise

        return supervise(args, socks)
    app = create_app(settings, backends=loaded.backends)
    try:
        app.start_hosts()  # a model host process that cannot load is this command's one line, before the port serves
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        _fail(exc, args.debug, own=isinstance(exc, HostStartError))  # its message is the host's own line
    return run_server(app, host=args.host, port=args.port, log_level=args.log_level, log_config=config, sock=sock)


def _serve_on_ray(args: argparse.Namespace, sock: socket.socket) -> int:
    """Deploy on Ray Serve, whose proxy listens on the port: the socket bound here only proved it free."""
    sock.close()
    if args.ray_address is None:
        # Read when Ray is imported: a local instance keeps its node address on loopback, where Ray would
        # otherwise take the machine's network address (for other nodes to join). Despite its name, on Linux too.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from scorekit.deploy.ray import run

    try:
        return run(args.settings, args.ray_options, host=args.host, port=args.port, address=args.ray_address)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        _fail(exc, args.debug)


def _fail(exc: Exception, debug: bool, *, own: bool = False) -> NoReturn:
    """One line on stderr: scorekit's own errors (a ValueError, or ``own``) are their message, anything else its
    type and first line.
    With ``--debug``, the traceback as well."""
    if debug:
        raise exc
    print(f"scorekit: error: {error_line(exc, own=own)} (--debug shows the traceback)", file=sys.stderr)
    sys.exit(1)
