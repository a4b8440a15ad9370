"""``scorekit serve``: flags into :class:`~scorekit.settings.Settings`, the models loaded, the app under uvicorn.

Each flag also reads ``SCOREKIT_<FLAG>`` from the environment (the command line wins), and a variable goes
through the same checks as its flag. Parsing imports no torch, so ``--help`` and a bad flag answer at once;
the model libraries load only once the flags are good. Every start-up error is one line on stderr.

``flags.py`` is the flag framework and its casts, ``table.py`` the flags, ``parser.py`` turns them into
settings, ``serve.py`` loads and serves.
"""

import os

# Before torch loads (every module of this package is imported after this line): OpenMP threads that spin at
# barriers starve the event loop on small or shared CPUs (docs/benchmarks.md). An explicit setting still wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from scorekit.cli.parser import build_parser, parse
from scorekit.cli.serve import main

__all__ = ["build_parser", "main", "parse"]
