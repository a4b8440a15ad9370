"""Where scorekit's log lines go: one format for the whole ``scorekit serve`` process, and a handler of its own
when embedded in a host that configured no logging.

Torch-free (transformers is imported only when its logging is set up), so the CLI configures logging before
the model libraries load.
"""

from __future__ import annotations

import logging
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def process_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for ``scorekit serve``: one stderr handler on the root logger, and scorekit's
    and uvicorn's loggers pass their records up to it, so every line has one format.

    uvicorn takes it as its ``log_config``; in place of its own default, which would give its loggers handlers
    and a format of their own. Other libraries log warnings and above.
    """
    level = level.upper()
    to_root = {"level": level, "handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"scorekit": {"format": FORMAT}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "scorekit", "stream": "ext://sys.stderr"},
        },
        "loggers": {name: dict(to_root) for name in ("scorekit", "uvicorn", "uvicorn.error", "uvicorn.access")},
        "root": {"level": "WARNING", "handlers": ["stderr"]},
    }


def route_transformers(level: str) -> None:
    """transformers logs through a handler and a format of its own: send its records to the root logger instead,
    only errors unless ``level`` is debug (its load reports run to dozens of lines about weights scorekit does not
    use; a model missing weights it needs is refused with one line of scorekit's own).

    huggingface_hub gives its logger a plain stderr handler of its own and also passes each record up: every hub
    warning (a retry, a slow download) printed twice, once without the format. Its handler goes, so each shows
    once, in the one format."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.set_verbosity(logging.WARNING if level.lower() == "debug" else logging.ERROR)
    hub = logging.getLogger("huggingface_hub")
    for handler in list(hub.handlers):
        hub.removeHandler(handler)
    hub.propagate = True


def ensure_visible() -> None:
    """Give the "scorekit" logger a stderr handler (and the INFO level) when neither it nor the root logger has a
    handler, as uvicorn does for its own loggers.

    A host app run under uvicorn with no logging set up has exactly that: its root logger has no handler, and
    logging's last resort prints warnings only, so scorekit's start-up line would be lost.
    """
    logger = logging.getLogger("scorekit")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
