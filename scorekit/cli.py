"""``scorekit serve``: flags into :class:`~scorekit.settings.Settings`, the model loaded, the app under uvicorn.

Each flag also reads ``SCOREKIT_<FLAG>`` from the environment (the command line wins), and a variable goes
through the same checks as its flag. Parsing imports no torch, so ``--help`` and a bad flag answer at once;
the model libraries load only once the flags are good. Every start-up error is one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging.config
import math
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

# Before torch loads: OpenMP threads that spin at barriers starve the event loop on small or shared
# CPUs (docs/benchmarks.md measured 2.6x-20x slower forwards). An explicit setting still wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from scorekit import __version__
from scorekit.choices import DTYPES, device_error, local_model, runtime_error, runtime_missing
from scorekit.connections import bind_listener
from scorekit.deploy.options import Autoscaling, RayOptions, max_ongoing_requests, target_ongoing_requests
from scorekit.logs import process_config, route_transformers
from scorekit.settings import LONG_DOCUMENTS, MODEL_KINDS, RUNTIMES, EngineConfig, ModelSpec, Settings

_ENGINE = EngineConfig()
_SETTINGS = Settings()
_RAY = RayOptions()
_LOG_LEVELS = ("debug", "info", "warning")
_EXAMPLES = """\
examples:
  scorekit serve                                   the embedded all-MiniLM-L6-v2 on 127.0.0.1:8000
  scorekit serve ./my-reranker --port 9000         a local model folder (its kind is detected)
  scorekit serve BAAI/bge-reranker-base --device cuda --dtype float16
  SCOREKIT_MAX_BATCH_TOKENS=8192 scorekit serve ./my-lm --model-kind causal-lm --served-model-name judge
  scorekit serve --model ./my-reranker --model minilm=./all-MiniLM-L6-v2   two models; `model` picks one
  scorekit serve --ray --replicas 2                two replicas on a local Ray Serve instance (the ray extra)
  scorekit serve --ray --ray-address auto --device cuda --num-gpus 1 --min-replicas 1 --max-replicas 8
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad flag answered in one line (argparse would print the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        _usage_error(self.prog, message)


def _usage_error(prog: str, message: str) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {message} (see `{prog} --help`)\n")
    sys.exit(2)


def _whole_or_auto(text: str) -> int:
    """A whole number from 1, or ``auto`` (0 here: ``_model_specs`` makes it None, sized for the device)."""
    if text == "auto":
        return 0
    try:
        return _whole(1)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or auto)") from None


def _whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (no upper bound when None)."""
    bounds = f"at least {low}" if high is None else f"from {low} to {high}"

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, not {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bounds}, not {value}")
        return value

    return whole


def _seconds(*, zero: bool) -> Callable[[str], float]:
    """A finite number of seconds, above zero (or zero too, when ``zero``)."""
    bounds = "0 or more" if zero else "above 0"

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a number of seconds {bounds}, not {text!r}")
        return value

    return seconds


def _share(text: str) -> float:
    """A number from 0 up to (not including) 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 up to 1 (not 1), not {text!r}")
    return value


def _text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _device(text: str) -> str:
    if (error := device_error(text)) is not None:
        raise argparse.ArgumentTypeError(error)
    return text


def _switch(text: str) -> bool:
    """An environment variable's on/off value (a flag on the command line needs none)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 1/true/yes/on or 0/false/no/off, not {text!r}")


def _amount(text: str) -> float:
    """A finite number, 0 or more (a share of CPUs or GPUs)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number, 0 or more, not {text!r}")
    return value


def _key_file(text: str) -> tuple[str, ...]:
    """The API keys in file ``text``: one a line, blank lines and ``#`` comments skipped."""
    try:
        with open(text, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {getattr(exc, 'strerror', None) or exc}") from None
    keys = tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise argparse.ArgumentTypeError(f"{text!r} holds no key (one a line; blank lines and # comments are skipped)")
    return keys


def _names(text: str) -> tuple[str, ...]:
    """A list as vLLM takes it (JSON: ``["https://a.example"]``) or comma-separated (``https://a.example,*``)."""
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
            raise argparse.ArgumentTypeError(f"expected a JSON list of strings or a comma-separated list, not {text!r}")
        return tuple(value)
    names = tuple(item.strip() for item in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list with no empty entry, not {text!r}")
    return names


@dataclass(frozen=True, slots=True)
class _Flag:
    """A ``--name`` flag and its ``SCOREKIT_NAME`` variable; the default applies when neither is given."""

    name: str
    cast: Callable[[str], Any]
    default: Any
    text: str
    shown: str | None = None  # how --help words the default, when its value says nothing (None)
    choices: Sequence[str] | None = None
    metavar: str | None = None
    repeat: bool = False  # may be given several times (a list); its variable holds one value

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "SCOREKIT_" + self.dest.upper()

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        # The default stays None here: a flag left off the command line then reads its variable (see _fill).
        default = self.shown or (f"{self.default:g}" if isinstance(self.default, float) else self.default)
        help = f"{self.text} (env {self.env}; default: {default})"
        if self.cast is _switch:
            parser.add_argument(f"--{self.name}", action="store_const", const=True, default=None, help=help)
        elif self.repeat:
            parser.add_argument(f"--{self.name}", type=self.cast, action="append", metavar=self.metavar, help=help)
        else:
            parser.add_argument(
                f"--{self.name}", type=self.cast, choices=self.choices, metavar=self.metavar, default=None, help=help
            )

    def from_env(self) -> Any:
        """The variable's value through the flag's own checks, or the default when it is unset or empty."""
        raw = os.environ.get(self.env, "")
        if not raw:
            return self.default
        try:
            value = [self.cast(raw)] if self.repeat else self.cast(raw)
        except argparse.ArgumentTypeError as exc:
            raise _FlagError(f"environment variable {self.env}: {exc}") from None
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(map(repr, self.choices))
            raise _FlagError(f"environment variable {self.env}: invalid choice: {raw!r} (choose from {choices})")
        return value


class _FlagError(Exception):
    """A check argparse cannot make failed: an environment variable's value, or MODEL against --model."""


_FLAGS = (
    _Flag(
        "model",
        _text,
        None,
        "A local model folder or a hub name (or give it as MODEL); NAME=MODEL serves it as NAME. Repeat it to"
        " serve several models, each with its own batcher and worker; a request's `model` field picks one,"
        " the first when it names none",
        "the embedded MiniLM",
        metavar="[NAME=]MODEL",
        repeat=True,
    ),
    _Flag(
        "served-model-name",
        _text,
        None,
        "The name clients use in `model` fields (one model only; name several with NAME=MODEL)",
        "the model as given",
        metavar="NAME",
    ),
    _Flag("model-kind", str, None, "Override detection (one model only)", "detected from config.json", MODEL_KINDS),
    _Flag("host", _text, "127.0.0.1", "Interface to bind", metavar="HOST"),
    _Flag("port", _whole(1, 65535), 8000, "Port to bind", metavar="PORT"),
    _Flag("device", _device, _SETTINGS.device, "torch device: cpu, cuda or cuda:N", metavar="DEVICE"),
    _Flag("dtype", str, _SETTINGS.dtype, "auto is float32 on cpu, float16 on cuda", choices=DTYPES),
    _Flag(
        "runtime",
        str,
        _SETTINGS.runtime,
        "What runs a bi-encoder's or cross-encoder's forward: torch; onnx (ONNX Runtime, the onnx extra; CPU"
        " and float32 only) or openvino (OpenVINO, the openvino extra; CPU, float32 or bfloat16), each exported"
        " once at load and cached; or torchscript (traced at load; on a GPU it gives the interpreter lock up far"
        " less often than torch; docs/models.md)",
        choices=RUNTIMES,
    ),
    _Flag(
        "cache-dir",
        _text,
        None,
        "Where --runtime onnx and openvino keep their exports",
        "$XDG_CACHE_HOME/scorekit, else ~/.cache/scorekit",
        metavar="DIR",
    ),
    _Flag(
        "max-model-len",
        _whole(1),
        None,
        "Longest input in tokens, for every model: caps a model's own maximum (more than it is a start-up error)",
        "each model's own",
        metavar="N",
    ),
    _Flag(
        "trust-remote-code",
        _switch,
        False,
        "Let transformers run a model's own Python code (for architectures it does not ship)",
        "off",
    ),
    _Flag(
        "reranker-template",
        _text,
        None,
        "An LLM reranker's prompt: a preset (qwen3-reranker, bge-reranker-v2-gemma) or a JSON file (one model"
        " only; docs/models.md)",
        "reranker_template.json beside the weights, else the preset of the model's type",
        metavar="PRESET|FILE",
    ),
    _Flag(
        "long-documents",
        str,
        _SETTINGS.long_documents,
        "What a document too long to sit beside its query gets when the request sets neither"
        " truncate_prompt_tokens nor max_chunks_per_doc: error (a 400, as vLLM) or chunk (scored by its best"
        " window)",
        choices=LONG_DOCUMENTS,
    ),
    _Flag(
        "chunk-overlap",
        _whole(0),
        _SETTINGS.chunk_overlap,
        "Tokens a chunked document's window shares with the one before it (at most half a window)",
        metavar="N",
    ),
    _Flag(
        "max-batch-tokens",
        _whole_or_auto,
        _ENGINE.max_batch_tokens,
        "Padded tokens (longest x count) per model batch; auto: 16384 on a CPU, and on a GPU what a share of the"
        " memory the model leaves free holds, measured at start-up",
        "auto",
        metavar="N|auto",
    ),
    _Flag("max-batch-size", _whole(1), _ENGINE.max_batch_size, "Items per model batch", metavar="N"),
    _Flag(
        "min-batch-size",
        _whole(1),
        _ENGINE.min_batch_size,
        "Items a batch cut by --batch-efficiency holds at least (the batch that carries a new request's first"
        " items may hold fewer)",
        metavar="N",
    ),
    _Flag(
        "model-workers",
        _whole(1),
        _ENGINE.model_workers,
        "Threads running batches of one model at once, from one queue: on a CPU, 2 runs two batches side by side"
        " on half of torch's intra-op threads each, which beats one batch on all of them (a lone batch still gets"
        " them all); each batch in flight holds its own activations",
        metavar="N",
    ),
    _Flag(
        "small-job-lane",
        _whole(0),
        _ENGINE.small_job_lane,
        "Requests of at most N model inputs may also run on a thread of their own that takes nothing larger, so a"
        " small request does not wait for a large one's batch to end (0: no lane)",
        metavar="N",
    ),
    _Flag(
        "max-queued-items", _whole(1), _ENGINE.max_queued_items, "Queued items before new requests get 503", metavar="N"
    ),
    _Flag(
        "max-concurrent-requests",
        _whole(1),
        _ENGINE.max_concurrent_requests,
        "Requests in flight before 503",
        metavar="N",
    ),
    _Flag(
        "max-queue-wait",
        _seconds(zero=False),
        _ENGINE.max_queue_wait,
        "Seconds a request may wait in the queue before any of its work runs; past it, 503 with Retry-After",
        "off",
        metavar="SECONDS",
    ),
    _Flag(
        "batch-efficiency",
        _share,
        _ENGINE.batch_efficiency,
        "The share of an endless batch's throughput a model batch must keep; batches are as short as that"
        " allows, by the cost of the batches so far (0: by --max-batch-tokens/--max-batch-size alone). A batch"
        " is never interrupted, so this bounds what a small request waits beside a large one",
        metavar="SHARE",
    ),
    _Flag("max-body-bytes", _whole(1), _SETTINGS.max_body_bytes, "Largest request body (413 above)", metavar="BYTES"),
    _Flag(
        "max-items-per-request",
        _whole(1),
        _SETTINGS.max_items_per_request,
        "Most documents/items per request",
        metavar="N",
    ),
    _Flag(
        "shutdown-timeout",
        _seconds(zero=True),
        _SETTINGS.shutdown_timeout,
        "Seconds in-flight requests get on SIGTERM before they are answered 503",
        metavar="SECONDS",
    ),
    _Flag(
        "limit-concurrency",
        _whole(0),
        _SETTINGS.limit_concurrency,
        "Most open connections; past it the oldest one yet to send a request head is closed. 0: the"
        " open-file limit less a reserve",
        metavar="N",
    ),
    _Flag(
        "header-timeout",
        _seconds(zero=False),
        _SETTINGS.header_timeout,
        "Seconds a connection gets to send its request head before it is closed",
        metavar="SECONDS",
    ),
    _Flag(
        "api-key",
        _text,
        None,
        "A key every request but /health, /ping, /metrics and /load must bring as `Authorization: Bearer KEY`"
        " (401 without it); repeat it for several. Its variable or --api-key-file keep it out of the process list",
        "none, no key asked",
        metavar="KEY",
        repeat=True,
    ),
    _Flag(
        "api-key-file",
        _key_file,
        None,
        "A file of API keys, one a line (blank lines and # comments skipped); they add to --api-key",
        "none",
        metavar="PATH",
    ),
    _Flag(
        "allowed-origins",
        _names,
        _SETTINGS.allowed_origins,
        "CORS origins, a JSON list or comma-separated (* for any); set, CORS answers as Starlette's"
        " CORSMiddleware does",
        "none, CORS off: a preflight gets 405",
        metavar="ORIGINS",
    ),
    _Flag("allowed-methods", _names, _SETTINGS.allowed_methods, "CORS methods", "*", metavar="METHODS"),
    _Flag("allowed-headers", _names, _SETTINGS.allowed_headers, "CORS request headers", "*", metavar="HEADERS"),
    _Flag("allow-credentials", _switch, _SETTINGS.allow_credentials, "CORS: allow credentials", "off"),
    _Flag("log-level", str, "info", "debug logs one line per batch", choices=_LOG_LEVELS),
    _Flag("debug", _switch, False, "Show the traceback of a start-up error, not just its message", "off"),
    _Flag(
        "ray",
        _switch,
        False,
        "Serve through Ray Serve (pip install 'scorekit[ray]'): replicas of this server behind Ray's HTTP proxy,"
        " which listens on --host and --port; see the Ray Serve flags below",
        "off",
    ),
)

# Only with --ray (docs/deployment.md). Their defaults come from RayOptions; None: sized from the engine limits.
_RAY_FLAGS = (
    _Flag("replicas", _whole(1), _RAY.replicas, "A fixed number of replicas", metavar="N"),
    _Flag("min-replicas", _whole(0), None, "Autoscale from this many replicas (with --max-replicas)", "1", metavar="N"),
    _Flag("max-replicas", _whole(1), None, "Autoscale up to this many replicas", "no autoscaling", metavar="N"),
    _Flag(
        "target-ongoing-requests",
        _whole(1),
        None,
        "Requests in flight per replica that autoscaling aims at",
        "a batch's worth, at most half of --max-ongoing-requests",
        metavar="N",
    ),
    _Flag(
        "max-ongoing-requests",
        _whole(1),
        None,
        "Requests Ray sends one replica at once; Ray queues the rest",
        "--max-concurrent-requests",
        metavar="N",
    ),
    _Flag("num-gpus", _amount, _RAY.num_gpus, "GPUs per replica (with --device cuda)", metavar="N"),
    _Flag("num-cpus", _amount, _RAY.num_cpus, "CPUs per replica", metavar="N"),
    _Flag(
        "ray-address",
        _text,
        None,
        "The Ray cluster to join (auto: the one `ray start` runs here)",
        "a local Ray instance, started and stopped with the server",
        metavar="ADDRESS",
    ),
    _Flag(
        "replica-probe-port",
        _whole(1, 65535),
        _RAY.probe_port,
        "Each replica also serves /health, /load and /metrics on --host at this port plus its rank on its node",
        "none",
        metavar="PORT",
    ),
)
_NOT_ON_RAY = ("limit-concurrency", "header-timeout")  # connection limits of scorekit's own server


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="scorekit", description="A scoring server for rerankers and scorers.")
    parser.add_argument("--version", action="version", version=f"scorekit {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="Serve a model over HTTP (default: the embedded all-MiniLM-L6-v2).",
        description="Serve a model over HTTP. Each flag also reads SCOREKIT_<FLAG>; the command line wins.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("positional_model", nargs="?", metavar="MODEL", type=_text, help="The same as --model")
    for flag in _FLAGS:
        flag.add_to(serve)
    ray = serve.add_argument_group("Ray Serve (with --ray)")
    for flag in _RAY_FLAGS:
        flag.add_to(ray)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags, filled from the environment and checked; a bad one exits 2 with one line on stderr.

    Bare ``scorekit`` prints the help and exits 0."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        parser.exit(0)
    try:
        _fill(args)
    except _FlagError as exc:
        _usage_error("scorekit serve", str(exc))
    return args


def _fill(args: argparse.Namespace) -> None:
    """MODEL is --model; flags left off the command line take their variable, else their default. Then
    ``args.models`` holds one ModelSpec per model to serve, the default first."""
    given = args.positional_model
    if given is not None:
        if args.model is not None and args.model != [given]:
            first = args.model[0] if len(args.model) == 1 else args.model
            raise _FlagError(
                f"the model is given twice, and differently: MODEL {given!r} and --model {first!r}"
                " (repeat --model to serve several)"
            )
        args.model = [given]
    given_flags = {flag.name for flag in (*_FLAGS, *_RAY_FLAGS) if _given(args, flag)}
    for flag in (*_FLAGS, *_RAY_FLAGS):
        if getattr(args, flag.dest) is None:
            setattr(args, flag.dest, flag.from_env())
    args.models = _model_specs(args)
    args.ray_options = _ray_options(args, given_flags) if args.ray else None
    if not args.ray and (ray_only := [f.name for f in _RAY_FLAGS if f.name in given_flags]):
        raise _FlagError(f"--{ray_only[0]} applies to Ray Serve only: add --ray")


def _given(args: argparse.Namespace, flag: _Flag) -> bool:
    """Whether the flag is on the command line or its variable is set."""
    return getattr(args, flag.dest) is not None or bool(os.environ.get(flag.env))


def _ray_options(args: argparse.Namespace, given: set[str]) -> RayOptions:
    """The --ray flags as RayOptions, with every combination Ray would refuse, or silently ignore, refused here."""
    if importlib.util.find_spec("ray") is None:
        raise _FlagError("--ray needs Ray Serve, which is not installed: pip install 'scorekit[ray]'")
    if ignored := [name for name in _NOT_ON_RAY if name in given]:
        raise _FlagError(f"--{ignored[0]} limits scorekit's own server; with --ray, Ray's proxy takes the connections")
    if args.device.startswith("cuda:"):
        raise _FlagError("--device cuda:N picks one GPU, but Ray gives each replica its own: use --device cuda")
    if args.num_gpus > 0 and args.device != "cuda":
        raise _FlagError("--num-gpus gives each replica a GPU: add --device cuda")
    scaling = {"min-replicas", "target-ongoing-requests"} & given
    if scaling and args.max_replicas is None:
        raise _FlagError(f"--{sorted(scaling)[0]} autoscales: add --max-replicas")
    if args.max_replicas is not None and "replicas" in given:
        raise _FlagError("--replicas is a fixed count and --max-replicas autoscales: give one of them")
    low = 1 if args.min_replicas is None else args.min_replicas
    if args.max_replicas is not None and low > args.max_replicas:
        raise _FlagError(f"--min-replicas ({low}) is above --max-replicas ({args.max_replicas})")
    try:
        autoscaling = None
        if args.max_replicas is not None:
            autoscaling = Autoscaling(low, args.max_replicas, args.target_ongoing_requests)
        options = RayOptions(
            replicas=args.replicas,
            autoscaling=autoscaling,
            num_gpus=args.num_gpus,
            num_cpus=args.num_cpus,
            max_ongoing_requests=args.max_ongoing_requests,
            probe_host=args.host,
            probe_port=args.replica_probe_port,
        )
    except ValueError as exc:
        raise _FlagError(str(exc)) from None
    settings = Settings(models=args.models)
    target, cap = target_ongoing_requests(settings, options), max_ongoing_requests(settings, options)
    if autoscaling is not None and target >= cap:
        raise _FlagError(
            f"--target-ongoing-requests ({target}) must be below --max-ongoing-requests"
            f" ({cap}, by default --max-concurrent-requests)"
        )
    return options


def _model_specs(args: argparse.Namespace) -> tuple[ModelSpec, ...]:
    """``[NAME=]MODEL`` entries as ModelSpecs sharing the device, dtype and engine flags."""
    entries = args.model or [None]
    if len(entries) > 1:
        for flag in ("served_model_name", "model_kind", "reranker_template"):
            if getattr(args, flag) is not None:
                option = "--" + flag.replace("_", "-")
                raise _FlagError(f"{option} applies to one model; with several, name each as --model NAME=MODEL")
    if (error := runtime_error(args.runtime, kind=args.model_kind, device=args.device, dtype=args.dtype)) is not None:
        raise _FlagError(error)
    if (missing := runtime_missing(args.runtime)) is not None:
        raise _FlagError(missing)
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
    )
    specs = []
    for entry in entries:
        name, path = _named(entry) if entry is not None else (None, None)
        specs.append(
            ModelSpec(
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
            )
        )
    names = [spec.served_name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise _FlagError(f"two models are served as {twice[0]!r}: give one of them another name with NAME=MODEL")
    return tuple(specs)


def _named(entry: str) -> tuple[str | None, str]:
    """``NAME=MODEL`` split in two; a plain MODEL (one whose text names an existing path, '=' or not) has no
    name of its own."""
    name, separator, path = entry.partition("=")
    if not separator or os.path.exists(entry):
        return None, entry
    if not name.strip() or not path.strip():
        raise _FlagError(f"--model {entry!r}: NAME=MODEL needs both a name and a model")
    return name, path


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        models=args.models,
        max_body_bytes=args.max_body_bytes,
        max_items_per_request=args.max_items_per_request,
        shutdown_timeout=args.shutdown_timeout,
        limit_concurrency=args.limit_concurrency,
        header_timeout=args.header_timeout,
        api_keys=tuple(dict.fromkeys([*(args.api_key or ()), *(args.api_key_file or ())])),
        allowed_origins=args.allowed_origins,
        allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials,
        long_documents=args.long_documents,
        chunk_overlap=args.chunk_overlap,
    )


def serve(args: argparse.Namespace) -> int:
    """Load the models, then serve them until a signal ends the drain. A start-up error is one line and exit 1."""
    try:
        for spec in args.models:
            if spec.path is not None:
                local_model(spec.path)  # a missing folder: said at once, before torch loads
        sock = bind_listener(args.host, args.port)  # a busy port too, not after the model loaded
    except ValueError as exc:
        _fail(exc, args.debug)
    config = process_config(args.log_level)
    logging.config.dictConfig(config)
    # The heavy imports (torch, transformers, uvicorn) come only now that the flags are good.
    from scorekit.app import check_long_documents, create_app
    from scorekit.models import default_model_path, detect_kind, load_spec
    from scorekit.models.budget import token_budgets
    from scorekit.serving import run_server

    route_transformers(args.log_level)
    settings = settings_from(args)
    if args.ray_options is not None:
        return _serve_on_ray(args, settings, sock)
    try:
        for spec in settings.served_models():
            if spec.runtime != "torch" and spec.kind is None:  # a kind the runtime cannot serve is a usage error
                kind = detect_kind(spec.path or default_model_path())
                if (error := runtime_error(spec.runtime, kind=kind, device=spec.device, dtype=spec.dtype)) is not None:
                    _usage_error("scorekit serve", f"{error} (model {spec.served_name!r} is a {kind})")
        backends = {spec.served_name: load_spec(spec) for spec in settings.served_models()}
        for name, backend in backends.items():
            check_long_documents(settings, name, backend)
        token_budgets(settings.served_models(), backends)  # a GPU without room: one line (the app reuses it)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        _fail(exc, args.debug)
    app = create_app(settings, backends=backends)
    return run_server(app, host=args.host, port=args.port, log_level=args.log_level, log_config=config, sock=sock)


def _serve_on_ray(args: argparse.Namespace, settings: Settings, sock: socket.socket) -> int:
    """Deploy on Ray Serve, whose proxy listens on the port: the socket bound here only proved it free."""
    sock.close()
    if args.ray_address is None:
        # Read when Ray is imported: a local instance keeps its node address on loopback, where Ray would
        # otherwise take the machine's network address (for other nodes to join). Despite its name, on Linux too.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from scorekit.deploy.ray import run

    try:
        return run(settings, args.ray_options, host=args.host, port=args.port, address=args.ray_address)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        _fail(exc, args.debug)


def _fail(exc: Exception, debug: bool) -> NoReturn:
    """One line on stderr: scorekit's own errors are their message, anything else its type and first line.
    With ``--debug``, the traceback as well."""
    if debug:
        raise exc
    lines = str(exc).strip().splitlines() or [""]
    message = lines[0] if isinstance(exc, ValueError) else f"{type(exc).__name__}: {lines[0]}".rstrip(": ")
    print(f"scorekit: error: {message.rstrip('.')} (--debug shows the traceback)", file=sys.stderr)
    sys.exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
