"""Where scorekit's log lines go: one format for the whole ``scorekit serve`` process (text, or with
``--log-format json`` one JSON object a line), and a handler of its own when embedded in a host that configured no
logging.

A request's record (:class:`RequestRecord`: its id, route and model) is the current one while the request runs,
so every line logged on its behalf carries them in the JSON format, and its access line (``scorekit.access``,
written by ``middleware/access.py``) adds its status and duration.

Torch-free (transformers is imported only when its logging is set up), so the CLI configures logging before
the model libraries load.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)
# The variable of ``--log-format``, which the processes ``scorekit serve`` starts (front ends, model hosts) read.
FORMAT_VARIABLE = "SCOREKIT_LOG_FORMAT"
ACCESS_LOGGER = "scorekit.access"
# The keys of every JSON line, in order: a line logged outside a request, or not the access line, has null for
# what it does not know.
JSON_KEYS = ("time", "level", "logger", "message", "request_id", "route", "status", "duration", "model")
# How much of a client's X-Request-Id a log line repeats.
REQUEST_ID_LIMIT = 200


@dataclass(slots=True)
class RequestRecord:
    """One HTTP request as its log lines name it: its id (the client's ``X-Request-Id``, else a fresh one), its
    canonical route (None: no route takes it), and the served model its body resolved to, once it has."""

    request_id: str
    route: str | None = None
    model: str | None = None


_CURRENT: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("scorekit_request", default=None)


@contextmanager
def request_record(record: RequestRecord) -> Iterator[RequestRecord]:
    """``record`` is the current request's for the block (and the tasks and threads it starts)."""
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


def current_record() -> RequestRecord | None:
    """The record of the request being served (None outside one): a layer that outlives the block it is current
    in keeps it (the traces read its model when the request ends)."""
    return _CURRENT.get()


def current_request_id() -> str:
    """The id of the request being served (its log lines carry it); a fresh one outside a request."""
    record = _CURRENT.get()
    return record.request_id if record is not None else uuid.uuid4().hex


def request_id_from(given: str | None) -> str:
    """A request's id: its client's (``X-Request-Id``), cut to :data:`REQUEST_ID_LIMIT` characters, or a fresh one
    when it sent none."""
    return given[:REQUEST_ID_LIMIT] if given else uuid.uuid4().hex


def note_model(name: str) -> None:
    """The request being served resolved its ``model`` to this served model (the registry says it)."""
    record = _CURRENT.get()
    if record is not None:
        record.model = name


class RequestFields(logging.Filter):
    """Puts the current request's id, route and model on every record logged while it runs (those given as
    ``extra``, as the access line gives them, stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _CURRENT.get()
        if current is not None:
            for key, value in (("request_id", current.request_id), ("route", current.route), ("model", current.model)):
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with :data:`JSON_KEYS` (and ``exception``, the traceback, when there is one):
    what a log pipeline (Loki, Elasticsearch, CloudWatch) indexes without a parsing rule."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in JSON_KEYS[4:]:
            line[key] = getattr(record, key, None)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


def _utc(created: float) -> str:
    """ISO 8601 in UTC, to the millisecond: ``2026-01-02T03:04:05.678Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def process_config(level: str, log_format: str = "text") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for ``scorekit serve``: one stderr handler on the root logger, and scorekit's
    and uvicorn's loggers pass their records up to it, so every line has one format.

    uvicorn takes it as its ``log_config``; in place of its own default, which would give its loggers handlers
    and a format of their own. Other libraries log warnings and above. In the JSON format the access line is
    scorekit's own (``scorekit.access``: it knows the route, the model and the duration), and uvicorn's goes
    nowhere; in the text format uvicorn's stays.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: use {' or '.join(LOG_FORMATS)}")
    level = level.upper()
    to_root = {"level": level, "handlers": [], "propagate": True}
    loggers: dict[str, Any] = {name: dict(to_root) for name in ("scorekit", "uvicorn", "uvicorn.error")}
    silent = {"handlers": [], "propagate": False}
    json_lines = log_format == "json"
    loggers["uvicorn.access"] = silent if json_lines else dict(to_root)
    loggers[ACCESS_LOGGER] = dict(to_root) if json_lines else silent
    formatter = {"()": JsonFormatter} if json_lines else {"format": FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"scorekit": formatter},
        "filters": {"request": {"()": RequestFields}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "scorekit",
                "filters": ["request"],
                "stream": "ext://sys.stderr",
            },
        },
        "loggers": loggers,
        "root": {"level": "WARNING", "handlers": ["stderr"]},
    }


def handed_down(log_format: str) -> None:
    """Hand the format to the processes this one starts (front ends, model hosts), through its variable."""
    os.environ[FORMAT_VARIABLE] = log_format


def inherited_format() -> str:
    """The format the process that started this one logs in (text when it said none)."""
    given = os.environ.get(FORMAT_VARIABLE, "text")
    return given if given in LOG_FORMATS else "text"


def host_logging() -> None:
    """A model host process's logging: its own short text format, or the JSON lines its server logs in."""
    handler = logging.StreamHandler()
    if inherited_format() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s scorekit model host: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


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
