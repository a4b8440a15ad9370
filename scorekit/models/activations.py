"""The activation a sentence-transformers CrossEncoder applies to its logit, read from where it saved it.

sentence-transformers v6 keeps the class's dotted path in ``config_sentence_transformers.json`` as
``activation_fn``, and reads it there first; v4 and v5 kept it in ``config.json`` under
``sentence_transformers.activation_fn``, and before v4 it was ``sbert_ce_default_activation_function``. It imports
any ``torch.`` path and instantiates it with no arguments; another path only with ``trust_remote_code``, else it
warns and falls back to its default, sigmoid for one label. scorekit reads the same places in the same order
and does the same, so a model saved with Tanh, Softplus or any other torch activation scores as
``CrossEncoder(path).predict`` scores it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import PretrainedConfig

from .pairs import sigmoid

logger = logging.getLogger("scorekit.models")

# Paths of the two activations scorekit computes in plain Python (exact, and no tensor per score).
_IDENTITY = {"torch.nn.Identity", "torch.nn.modules.linear.Identity"}
_SIGMOID = {"torch.nn.Sigmoid", "torch.nn.modules.activation.Sigmoid"}
DEFAULT = "torch.nn.modules.activation.Sigmoid"


@dataclass(frozen=True, slots=True)
class Activation:
    """The function from a logit to the score, the path it was read as (or the default's), and how the start-up
    log says which it is and where it was read."""

    path: str
    apply: Callable[[float], float]
    said: str = ""

    def __call__(self, logit: float) -> float:
        return self.apply(logit)


def saved_activation(
    config: PretrainedConfig, sentence_transformers: Any, name: str, *, trust_remote_code: bool
) -> Activation:
    """The activation the model's files ask for (sentence-transformers' places, order and rules), else sigmoid:
    ``sentence_transformers`` is the parsed ``config_sentence_transformers.json`` (None without one)."""
    path = sentence_transformers.get("activation_fn") if isinstance(sentence_transformers, dict) else None
    where = "config_sentence_transformers.json's activation_fn"
    if path is None:
        saved = getattr(config, "sentence_transformers", None)
        path = saved.get("activation_fn") if isinstance(saved, dict) else None
        where = "config.json's sentence_transformers.activation_fn"
    if path is None:
        path = getattr(config, "sbert_ce_default_activation_function", None)
        where = "config.json's sbert_ce_default_activation_function"
    if path is None:
        return Activation(DEFAULT, sigmoid, f"the default activation {DEFAULT} (none saved)")
    chosen = _chosen(path, name, trust_remote_code=trust_remote_code)
    return chosen if chosen.said else replace(chosen, said=f"its saved activation {chosen.path} ({where})")


def _chosen(path: Any, name: str, *, trust_remote_code: bool) -> Activation:
    """The activation a saved ``path`` makes, as sentence-transformers makes it."""
    if path in _SIGMOID:
        return Activation(DEFAULT, sigmoid)
    if not isinstance(path, str):
        raise ValueError(f"Model {name!r} saved an activation that is not a dotted path: {path!r}.")
    if path in _IDENTITY:
        return Activation(path, float)
    if not (path.startswith("torch.") or trust_remote_code):
        logger.warning(
            "model %r asks for the activation %r, which is not torch's: sigmoid instead, as sentence-transformers"
            " does (--trust-remote-code runs it)",
            name,
            path,
        )
        return Activation(DEFAULT, sigmoid, f"the default activation {DEFAULT} (its saved {path} is not torch's)")
    return Activation(path, _imported(path, name))


def module_at(path: str, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The class at the dotted ``path``, made with no arguments (as sentence-transformers makes a saved
    activation); a one-line ValueError naming model ``name`` when it cannot be made or called."""
    module_name, _, class_name = path.rpartition(".")
    try:
        made = getattr(importlib.import_module(module_name), class_name)()
    except Exception as exc:
        raise ValueError(f"Model {name!r} asks for the activation {path!r}, which cannot be made: {exc}") from None
    if not callable(made):
        raise ValueError(f"Model {name!r} asks for the activation {path!r}, which is not a function.")
    return made  # type: ignore[no-any-return]


def _imported(path: str, name: str) -> Callable[[float], float]:
    """The activation at ``path`` applied to one float32 logit as to the model's output."""
    made = module_at(path, name)

    def apply(logit: float) -> float:
        with torch.inference_mode():
            return float(made(torch.tensor([logit], dtype=torch.float32))[0])

    return apply
