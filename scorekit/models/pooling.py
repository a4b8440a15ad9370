"""sentence-transformers' Pooling module: its modes, read from the module's config, and the pooling itself over
right-padded rows. A bi-encoder pools its transformer's tokens into its embedding; a modular CrossEncoder pools
them into what its head reads."""

from __future__ import annotations

from typing import Any, Literal

import torch

from .files import Source

Pooling = Literal["mean", "mean_sqrt_len_tokens", "cls", "max", "lasttoken"]
# The pooling names sentence-transformers saves.
POOLINGS: dict[str, Pooling] = {
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "cls": "cls",
    "max": "max",
    "lasttoken": "lasttoken",
}
# Pre-v5 pooling configs name the mode with one flag per mode.
LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def pool(mode: Pooling, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sentence-transformers' pooling over right-padded rows (padding is where ``mask`` is 0). ``cls`` takes the
    first token the mask keeps and ``lasttoken`` the last, as sentence-transformers does: the first is [CLS]
    unless a prompt's tokens are masked out of pooling (``include_prompt: false``)."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if mode == "cls":
        return hidden[rows, mask.argmax(dim=1)]
    if mode == "lasttoken":
        return hidden[rows, mask.shape[1] - 1 - mask.flip(1).argmax(dim=1)]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    summed, count = (hidden * weights).sum(dim=1), weights.sum(dim=1).clamp(min=1e-9)
    return summed / (count.sqrt() if mode == "mean_sqrt_len_tokens" else count)


def pools_prompt(folder: Source | None) -> bool:
    """The Pooling module's ``include_prompt``: false leaves a prompt's tokens out of the pooled vector (what
    INSTRUCTOR-style models are trained with); true when the config does not say."""
    config: Any = None if folder is None else folder.read_json("config.json")
    return not isinstance(config, dict) or config.get("include_prompt", True) is not False


def read_pooling(folder: Source | None, name: str) -> Pooling:
    """The single pooling mode of the Pooling module's config (in ``folder``); mean when there is none."""
    config: Any = None if folder is None else folder.read_json("config.json")
    if not isinstance(config, dict):
        return "mean"
    if "pooling_mode" in config:
        saved = config["pooling_mode"]
        modes = [saved] if isinstance(saved, str) else list(saved)
    else:
        modes = [mode for flag, mode in LEGACY_FLAGS.items() if config.get(flag)] or ["mean"]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise ValueError(f"Model {name!r} pools with {modes!r}; scorekit supports one of {sorted(POOLINGS)}.")
    return POOLINGS[modes[0]]
