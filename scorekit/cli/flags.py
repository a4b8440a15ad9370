"""The flag framework: a ``--name`` flag and its ``SCOREKIT_NAME`` variable, the casts that check a value, and
a bad value answered in one line."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from scorekit.choices import device_error
from scorekit.settings import ApiKey
from scorekit.tracing import check_endpoint


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag answered in one line (argparse would print the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)


def usage_error(prog: str, message: str) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {message} (see `{prog} --help`)\n")
    sys.exit(2)


def error_line(exc: Exception, *, own: bool = False) -> str:
    """A start-up error in one line: scorekit's own errors (a ValueError, or ``own``) are their message, anything
    else its type and first line."""
    lines = str(exc).strip().splitlines() or [""]
    message = lines[0] if own or isinstance(exc, ValueError) else f"{type(exc).__name__}: {lines[0]}".rstrip(": ")
    return message.rstrip(".")


class FlagError(Exception):
    """A check argparse cannot make failed: an environment variable's value, or MODEL against --model."""


@dataclass(frozen=True, slots=True)
class Flag:
    """A ``--name`` flag and its ``SCOREKIT_NAME`` variable; the default applies when neither is given."""

    name: str
    cast: Callable[[str], Any]
    default: Any
    text: str
    shown: str | None = None  # how --help words the default, when its value says nothing (None)
    choices: Sequence[str] | None = None
    metavar: str | None = None
    repeat: bool = False  # may be given several times (a list); its variable holds one value
    aliases: tuple[str, ...] = ()  # other names a peer's command lines use for it (TEI's --otlp-endpoint)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return "SCOREKIT_" + self.dest.upper()

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        # The default stays None here: a flag left off the command line then reads its variable (see from_env).
        default = self.shown or (f"{self.default:g}" if isinstance(self.default, float) else self.default)
        help = f"{self.text} (env {self.env}; default: {default})"
        names = [f"--{name}" for name in (self.name, *self.aliases)]
        if self.cast is switch:
            parser.add_argument(*names, dest=self.dest, action="store_const", const=True, default=None, help=help)
        elif self.repeat:
            parser.add_argument(
                *names, dest=self.dest, type=self.cast, action="append", metavar=self.metavar, help=help
            )
        else:
            parser.add_argument(
                *names,
                dest=self.dest,
                type=self.cast,
                choices=self.choices,
                metavar=self.metavar,
                default=None,
                help=help,
            )

    def given(self, args: argparse.Namespace) -> bool:
        """Whether the flag is on the command line or its variable is set."""
        return getattr(args, self.dest) is not None or bool(os.environ.get(self.env))

    def from_env(self) -> Any:
        """The variable's value through the flag's own checks, or the default when it is unset or empty."""
        raw = os.environ.get(self.env, "")
        if not raw:
            return self.default
        try:
            value = [self.cast(raw)] if self.repeat else self.cast(raw)
        except argparse.ArgumentTypeError as exc:
            raise FlagError(f"environment variable {self.env}: {exc}") from None
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(map(repr, self.choices))
            raise FlagError(f"environment variable {self.env}: invalid choice: {raw!r} (choose from {choices})")
        return value


# -- casts: each turns a flag's text into its value, or says in argparse's way why it cannot -------------------


def whole_or_auto(high: int | None = None) -> Callable[[str], int]:
    """A whole number from 1 (to ``high``), or ``auto`` (0 here: the model specs or the parser pick)."""
    count = whole(1, high)

    def cast(text: str) -> int:
        if text == "auto":
            return 0
        try:
            return count(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (or auto)") from None

    return cast


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (no upper bound when None)."""
    bounds = f"at least {low}" if high is None else f"from {low} to {high}"

    def cast(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, not {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bounds}, not {value}")
        return value

    return cast


def seconds(*, zero: bool) -> Callable[[str], float]:
    """A finite number of seconds, above zero (or zero too, when ``zero``)."""
    bounds = "0 or more" if zero else "above 0"

    def cast(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a number of seconds {bounds}, not {text!r}")
        return value

    return cast


def share(text: str) -> float:
    """A number from 0 up to (not including) 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 up to 1 (not 1), not {text!r}")
    return value


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def device(text: str) -> str:
    if (error := device_error(text)) is not None:
        raise argparse.ArgumentTypeError(error)
    return text


def switch(text: str) -> bool:
    """An environment variable's on/off value (a flag on the command line needs none)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 1/true/yes/on or 0/false/no/off, not {text!r}")


def amount(text: str) -> float:
    """A finite number, 0 or more (a share of CPUs or GPUs)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number, 0 or more, not {text!r}")
    return value


def key_file(text: str) -> tuple[str | ApiKey, ...]:
    """The API keys in file ``text``: one a line, blank lines and ``#`` comments skipped. A key may be followed by
    ``NAME=VALUE`` fields (``name``, ``weight``, ``requests_per_minute``, ``items_per_minute``): that line is an
    :class:`ApiKey`, a bare key a string. An error names the line, never the key."""
    try:
        with open(text, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {getattr(exc, 'strerror', None) or exc}") from None
    kept = [(n, line) for n, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    if not kept:
        raise argparse.ArgumentTypeError(f"{text!r} holds no key (one a line; blank lines and # comments are skipped)")
    return tuple(_key_line(text, n, line) for n, line in kept)


# A key file line's fields, and how each value is read.
_KEY_FIELDS: dict[str, Callable[[str], object]] = {
    "name": str,
    "weight": float,
    "requests_per_minute": int,
    "items_per_minute": int,
}


def _key_line(path: str, number: int, line: str) -> str | ApiKey:
    key, *given = line.split()
    if not given:
        return key
    values: dict[str, Any] = {}
    for item in given:
        name, equals, value = item.partition("=")
        if name not in _KEY_FIELDS or not equals or name in values:
            raise argparse.ArgumentTypeError(
                f"{path!r} line {number}: after the key, expected NAME=VALUE fields, each once, of "
                f"{', '.join(_KEY_FIELDS)}; not {item[:40]!r}"
            )
        try:
            values[name] = _KEY_FIELDS[name](value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{path!r} line {number}: {name} {value[:40]!r} is not a number") from None
    try:
        return ApiKey(key, **values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path!r} line {number}: {exc}") from None


def otlp_url(text: str) -> str:
    """An OTLP collector's http:// or https:// URL."""
    try:
        return check_endpoint(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def names(text: str) -> tuple[str, ...]:
    """A list as vLLM takes it (JSON: ``["https://a.example"]``) or comma-separated (``https://a.example,*``)."""
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
            raise argparse.ArgumentTypeError(f"expected a JSON list of strings or a comma-separated list, not {text!r}")
        return tuple(value)
    found = tuple(item.strip() for item in text.split(","))
    if not all(found):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list with no empty entry, not {text!r}")
    return found
