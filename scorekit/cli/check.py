"""``scorekit check PATH``: how a model folder will be served, and whether what scorekit serves is what its reference
recipe computes.

It loads the model as ``scorekit serve`` would (the same flags, the same detection), prints the lines the start-up
log gives (kind and why, activation, template and labels, pooling, longest input, runtime, device and dtype), then
runs a few probes through the served path and through a reference written apart from it (:mod:`.reference`), and
prints them side by side. It exits 0 when every difference is at most 1e-4, 1 with one line on stderr per
difference above it, and 2 when the flags are wrong or the model or its reference cannot be loaded (one line).

Parsing imports no torch, as ``scorekit serve``'s: the model libraries load once the flags are good.
"""

from __future__ import annotations

import argparse
import logging.config
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from scorekit.choices import UnfitRuntime, runtime_missing
from scorekit.cli.flags import FlagError, error_line, nonempty, usage_error
from scorekit.cli.table import FLAGS
from scorekit.logs import process_config, route_transformers
from scorekit.settings import ModelSpec

if TYPE_CHECKING:
    from scorekit.cli.probes import Row

TOLERANCE = 1e-4
SHOWN = "1e-4"  # the tolerance as the output writes it
PROG = "scorekit check"
# The serve flags that say how one model loads: what the check takes too.
_FLAGS = tuple(
    flag
    for flag in FLAGS
    if flag.name
    in (
        "model-kind",
        "device",
        "dtype",
        "runtime",
        "cache-dir",
        "max-model-len",
        "trust-remote-code",
        "reranker-template",
        "debug",
    )
)
EXAMPLES = """\
examples:
  scorekit check ./my-reranker                     how it is served, and its scores against its reference
  scorekit check ./Qwen3-Reranker-0.6B --reranker-template qwen3-reranker
  scorekit check ./my-reranker --runtime onnx      the ONNX export's scores against the reference
"""


def add_parser(commands: Any) -> None:
    """The ``check`` subcommand, on argparse's subparsers ``commands``."""
    check = commands.add_parser(
        "check",
        help="Say how a model folder will be served, and compare its scores with its reference recipe.",
        description=(
            "Load a model as `scorekit serve` would, print how it is served, run a few probes through the served\n"
            "path and through the reference recipe (sentence-transformers for a Sentence-Transformers model, a\n"
            f"plain transformers forward otherwise), and exit 1 when any two differ by more than {SHOWN}.\n"
            "Each flag also reads SCOREKIT_<FLAG>, as serve's; the command line wins."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("path", metavar="PATH", type=nonempty, help="A local model folder, or a hub name in the cache")
    for flag in _FLAGS:
        flag.add_to(check)


def fill(args: argparse.Namespace) -> None:
    """Flags left off take their variable, else their default; then ``args.spec``, the model as serve would
    load it, checked as serve checks it (a FlagError says what is wrong)."""
    for flag in _FLAGS:
        if getattr(args, flag.dest) is None:
            setattr(args, flag.dest, flag.from_env())
    try:
        args.spec = ModelSpec(
            args.path,
            kind=args.model_kind,
            device=args.device,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            trust_remote_code=args.trust_remote_code,
            reranker_template=args.reranker_template,
            runtime=args.runtime,
            cache_dir=args.cache_dir,
        )
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    if (missing := runtime_missing(args.runtime)) is not None:
        raise FlagError(missing)


def run_check(args: argparse.Namespace) -> int:
    """The command: warnings only in the log (the description is printed, not logged), then :func:`check`."""
    logging.config.dictConfig(process_config("warning"))
    # The heavy imports (torch, transformers) come only now that the flags are good.
    from transformers.utils import logging as hf_logging

    route_transformers("warning")
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # the reference's loads draw none either
    return check(args.spec, debug=args.debug)


def check(spec: ModelSpec, *, debug: bool = False) -> int:
    """Load, describe, probe, compare (see the module docstring); the exit status, or SystemExit(2)."""
    import torch

    from scorekit.cli.probes import Row, probe_rows, table
    from scorekit.cli.reference import recipe_for
    from scorekit.models import load_spec
    from scorekit.models.files import parse_dtype
    from scorekit.models.loaded import LoadedModel

    try:
        backend = load_spec(spec)
    except UnfitRuntime as exc:
        usage_error(PROG, f"{exc} (model {exc.model!r} is a {exc.kind})")
    except Exception as exc:
        _refuse(exc, debug)
    assert isinstance(backend, LoadedModel)  # every backend load_spec makes
    print("\n".join(backend.described))
    try:
        recipe = recipe_for(backend, backend.name, device=spec.device, trust_remote_code=spec.trust_remote_code)
        rows = probe_rows(backend, recipe)
    except Exception as exc:
        _refuse(exc, debug)
    print(f"\n{table(rows)}")
    compared = [row for row in rows if isinstance(row, Row)]
    differ = apart(compared)
    for row in differ:
        print(
            f"{PROG}: {row.probe}: served {row.served:.6f}, the reference {row.reference:.6f}:"
            f" {row.difference:.1e} apart, over {SHOWN}",
            file=sys.stderr,
        )
    print(f"\n{len(compared) - len(differ)} of {len(compared)} probes agree with the reference to {SHOWN}")
    if (dtype := parse_dtype(spec.dtype, torch.device(spec.device))) != torch.float32:
        shown = str(dtype).removeprefix("torch.")
        print(f"(in {shown}, a real model's scores round by about 1e-3: --dtype float32 checks the recipe itself)")
    return 1 if differ else 0


def apart(rows: Sequence[Row]) -> list[Row]:
    """The rows whose two values differ by more than the tolerance (a NaN is apart too)."""
    return [row for row in rows if not row.difference <= TOLERANCE]


def _refuse(exc: Exception, debug: bool) -> NoReturn:
    """The model or its reference cannot be loaded: one line, exit 2 (with --debug, the traceback)."""
    if debug:
        raise exc
    print(f"{PROG}: error: {error_line(exc)} (--debug shows the traceback)", file=sys.stderr)
    sys.exit(2)
