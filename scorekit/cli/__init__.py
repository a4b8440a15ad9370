"""``scorekit serve``: flags into :class:`~scorekit.settings.Settings`, the models loaded, the app under uvicorn.

Each flag also reads ``SCOREKIT_<FLAG>`` from the environment (the command line wins), and a variable goes
through the same checks as its flag. Parsing imports no torch, so ``--help`` and a bad flag answer at once;
the model libraries load only once the flags are good. Every start-up error is one line on stderr.

``flags.py`` is the flag framework and its casts, ``table.py`` the flags, ``parser.py`` turns them into
settings, ``serve.py`` loads and serves. ``scorekit check`` (``check.py``) loads one model as serve would, says
how it is served, and compares its scores on a few probes (``probes.py``) with its reference recipe
(``reference.py``).
"""

import os

# Before torch loads (every module of this package is imported after this line): OpenMP threads that spin at
# barriers starve the event loop on small or shared CPUs (docs/benchmarks.md). An explicit setting still wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Sequence

from scorekit.cli.check import run_check
from scorekit.cli.parser import build_parser, parse
from scorekit.cli.serve import serve

__all__ = ["build_parser", "main", "parse"]


def main(argv: Sequence[str] | None = None) -> int:
    """``scorekit COMMAND``: the flags parsed and checked, then the command run; its exit status."""
    args = parse(argv)
    return run_check(args) if args.command == "check" else serve(args)
