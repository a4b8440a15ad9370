"""``scorekit serve``'s flags into one :class:`~scorekit.settings.Settings` (and, with ``--ray``, one
:class:`~scorekit.deploy.options.RayOptions`), every rule that needs no model checked while parsing; ``scorekit
check``'s into its one model (:mod:`scorekit.cli.check`)."""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Sequence

from scorekit import __version__
from scorekit.choices import runtime_missing
from scorekit.cli import check
from scorekit.cli.flags import FlagError, Parser, nonempty, usage_error
from scorekit.cli.table import FLAGS, RAY_FLAGS
from scorekit.deploy.options import RayOptions
from scorekit.settings import ApiKey, EngineConfig, ModelSpec, Settings
from scorekit.tracing import TraceConfig, check_installed

EXAMPLES = """\
examples:
  scorekit serve                                   the embedded all-MiniLM-L6-v2 on 127.0.0.1:8000
  scorekit serve ./my-reranker --port 9000         a local model folder (its kind is detected)
  scorekit serve BAAI/bge-reranker-base --device cuda --dtype float16
  SCOREKIT_MAX_BATCH_TOKENS=8192 scorekit serve ./my-lm --model-kind causal-lm --served-model-name judge
  scorekit serve --model ./my-reranker --model minilm=./all-MiniLM-L6-v2   two models; `model` picks one
  scorekit serve ./my-reranker --device cuda --api-processes auto   front ends in processes of their own
  scorekit serve --ray --replicas 2                two replicas on a local Ray Serve instance (the ray extra)
  scorekit serve --ray --ray-address auto --device cuda --num-gpus 1 --min-replicas 1 --max-replicas 8
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="scorekit", description="A scoring server for rerankers and scorers.")
    parser.add_argument("--version", action="version", version=f"scorekit {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="Serve a model over HTTP (default: the embedded all-MiniLM-L6-v2).",
        description="Serve a model over HTTP. Each flag also reads SCOREKIT_<FLAG>; the command line wins.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("positional_model", nargs="?", metavar="MODEL", type=nonempty, help="The same as --model")
    for flag in FLAGS:
        flag.add_to(serve)
    ray = serve.add_argument_group("Ray Serve (with --ray)")
    for flag in RAY_FLAGS:
        flag.add_to(ray)
    check.add_parser(commands)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags, filled from the environment and checked; a bad one exits 2 with one line on stderr. Then, for
    ``serve``, ``args.settings`` holds the settings and ``args.ray_options`` the Ray Serve options (None without
    --ray); for ``check``, ``args.spec`` the model (:mod:`scorekit.cli.check`).

    Bare ``scorekit`` prints the help and exits 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        parser.exit(0)
    try:
        if args.command == "check":
            check.fill(args)
        else:
            _fill(args)
    except FlagError as exc:
        usage_error(f"scorekit {args.command}", str(exc))
    return args


def _fill(args: argparse.Namespace) -> None:
    """MODEL is --model; flags left off the command line take their variable, else their default; then the
    settings, and the Ray options."""
    given = args.positional_model
    if given is not None:
        if args.model is not None and args.model != [given]:
            first = args.model[0] if len(args.model) == 1 else args.model
            raise FlagError(
                f"the model is given twice, and differently: MODEL {given!r} and --model {first!r}"
                " (repeat --model to serve several)"
            )
        args.model = [given]
    given_flags = {flag.name for flag in (*FLAGS, *RAY_FLAGS) if flag.given(args)}
    for flag in (*FLAGS, *RAY_FLAGS):
        if getattr(args, flag.dest) is None:
            setattr(args, flag.dest, flag.from_env())
    _eager(args, runtime_given="runtime" in given_flags)
    _front_ends(args, host_given="model-host" in given_flags)
    specs = _model_specs(args)
    try:
        args.settings = _settings(args, specs)
    except ValueError as exc:  # what the settings refuse as a whole: a key, or a key's name, given twice
        raise FlagError(str(exc)) from None
    _traces(args.settings)
    if args.ray and args.model_host == "process":
        raise FlagError("--model-host process does not run under --ray yet: a Ray replica runs its model in process")
    args.ray_options = _ray_options(args, given_flags) if args.ray else None
    if not args.ray and (ray_only := [f.name for f in RAY_FLAGS if f.name in given_flags]):
        raise FlagError(f"--{ray_only[0]} applies to Ray Serve only: add --ray")


def _traces(settings: Settings) -> None:
    """Traces asked for (a flag, or the OTEL_* variables) with a bad variable, or without the otel extra: said now,
    before any model loads."""
    try:
        if TraceConfig.resolve(settings) is not None:
            check_installed()
    except ValueError as exc:
        raise FlagError(str(exc)) from None


def _eager(args: argparse.Namespace, *, runtime_given: bool) -> None:
    """``--enforce-eager``, vLLM's flag, means the eager runtime: torch's (no trace, no export); another runtime
    asked for beside it is a contradiction, refused."""
    if not args.enforce_eager:
        return
    if runtime_given and args.runtime != "torch":
        raise FlagError(
            f"--enforce-eager runs the eager runtime (torch), but --runtime is {args.runtime}: leave one of them out"
        )
    args.runtime = "torch"


def _front_ends(args: argparse.Namespace, *, host_given: bool) -> None:
    """``--api-processes``: auto resolved (1 on a CPU, whose cores the forward wants; a quarter of the cores, 2 to
    8, beside a GPU); more than one hosts every model in a process of its own, which every front end feeds."""
    if args.ray and args.api_processes != 1:
        raise FlagError("--api-processes applies without --ray: Ray Serve runs replicas of its own (--replicas)")
    if args.api_processes == 0:
        on_cpu = not args.device.startswith("cuda")
        args.api_processes = 1 if on_cpu else min(8, max(2, (os.cpu_count() or 1) // 4))
    if args.api_processes > 1:
        if host_given and args.model_host == "thread":
            raise FlagError(
                f"--api-processes {args.api_processes} feeds every model from a model host process: leave out"
                " --model-host thread"
            )
        args.model_host = "process"


def _ray_options(args: argparse.Namespace, given: set[str]) -> RayOptions:
    if importlib.util.find_spec("ray") is None:
        raise FlagError("--ray needs Ray Serve, which is not installed: pip install 'scorekit[ray]'")
    try:
        return RayOptions.from_flags(
            args.settings,
            given=given,
            replicas=args.replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_ongoing=args.target_ongoing_requests,
            max_ongoing=args.max_ongoing_requests,
            num_gpus=args.num_gpus,
            num_cpus=args.num_cpus,
            probe_host=args.host,
            probe_port=args.replica_probe_port,
        )
    except ValueError as exc:
        raise FlagError(str(exc)) from None


def _model_specs(args: argparse.Namespace) -> tuple[ModelSpec, ...]:
    """``[NAME=]MODEL`` entries as ModelSpecs sharing the device, dtype and engine flags."""
    entries = args.model or [None]
    if len(entries) > 1:
        for flag in ("served_model_name", "model_kind", "reranker_template"):
            if getattr(args, flag) is not None:
                option = "--" + flag.replace("_", "-")
                raise FlagError(f"{option} applies to one model; with several, name each as --model NAME=MODEL")
    engine = EngineConfig(
        max_batch_tokens=args.max_batch_tokens or None,  # auto (0): sized for the device
        max_batch_size=args.max_batch_size,
        max_queued_items=args.max_queued_items,
        max_concurrent_requests=args.max_concurrent_requests,
        max_queue_wait=args.max_queue_wait,
        batch_efficiency=args.batch_efficiency or None,  # 0: off
        min_batch_size=args.min_batch_size,
        model_workers=args.model_workers,
        small_job_lane=args.small_job_lane,
        priority_aging=args.priority_aging,
    )
    specs = []
    for entry in entries:
        name, path = _named(entry) if entry is not None else (None, None)
        try:  # what the runtime cannot serve (of the given kind) is refused here, by ModelSpec's own check
            spec = ModelSpec(
                path,
                name or args.served_model_name,
                args.model_kind,
                args.device,
                args.dtype,
                engine,
                args.max_model_len,
                args.trust_remote_code,
                args.reranker_template,
                args.runtime,
                args.cache_dir,
                args.model_host,
            )
        except ValueError as exc:
            raise FlagError(str(exc)) from None
        specs.append(spec)
    if (missing := runtime_missing(args.runtime)) is not None:
        raise FlagError(missing)
    names = [spec.served_name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FlagError(f"two models are served as {twice[0]!r}: give one of them another name with NAME=MODEL")
    return tuple(specs)


def _named(entry: str) -> tuple[str | None, str]:
    """``NAME=MODEL`` split in two; a plain MODEL (one whose text names an existing path, '=' or not) has no
    name of its own."""
    name, separator, path = entry.partition("=")
    if not separator or os.path.exists(entry):
        return None, entry
    if not name.strip() or not path.strip():
        raise FlagError(f"--model {entry!r}: NAME=MODEL needs both a name and a model")
    return name, path


def _settings(args: argparse.Namespace, models: tuple[ModelSpec, ...]) -> Settings:
    return Settings(
        models=models,
        max_body_bytes=args.max_body_bytes,
        max_items_per_request=args.max_items_per_request,
        shutdown_timeout=args.shutdown_timeout,
        limit_concurrency=args.limit_concurrency,
        header_timeout=args.header_timeout,
        api_keys=_api_keys(args),
        allowed_origins=args.allowed_origins,
        allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials,
        long_documents=args.long_documents,
        chunk_overlap=args.chunk_overlap,
        access_log=args.log_format == "json",  # scorekit's access line, in place of uvicorn's (logs.process_config)
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        otlp_traces_protocol=args.otlp_traces_protocol,
        otlp_service_name=args.otlp_service_name,
    )


def _api_keys(args: argparse.Namespace) -> tuple[str | ApiKey, ...]:
    """``--api-key``'s keys, then the key file's, each key once; where the file gives a key fields, the file's."""
    keys: dict[str, str | ApiKey] = {}
    for key in [*(args.api_key or ()), *(args.api_key_file or ())]:
        text = key if isinstance(key, str) else key.key
        if isinstance(key, ApiKey) or text not in keys:
            keys[text] = key
    return tuple(keys.values())
