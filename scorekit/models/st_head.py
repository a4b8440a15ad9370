"""A sentence-transformers CrossEncoder saved module by module (v6; the Ettin rerankers): its transformer is a
backbone (``transformer_task`` "feature-extraction"), and ``modules.json`` lists a head after it, such as Pooling
-> Dense -> LayerNorm -> Dense, the last writing ``scores``. The head is read from the module folders and run as
sentence-transformers runs it: each module reads and writes one features dict.

Heads sentence-transformers ships for cross-encoders are built here: Pooling (one mode), Dense (its saved
activation, its residual), LayerNorm, Normalize and Dropout (nothing at inference). Any other module is a one-line
start-up error naming it, never a score computed without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from transformers.utils.hub import cached_file

from .activations import module_at
from .files import Source, loading
from .pooling import Pooling, pool, read_pooling

Features = dict[str, torch.Tensor]
_EMBEDDING = "sentence_embedding"


def modular_transformer(source: Source) -> tuple[str, list[Any]] | None:
    """The transformer module's folder of a CrossEncoder whose transformer is a backbone with a head after it,
    and its modules.json; None for any other folder (a plain cross-encoder, whose head is its own classifier,
    included)."""
    saved = source.read_json("config_sentence_transformers.json")
    modules = source.read_json("modules.json")
    if not isinstance(saved, dict) or saved.get("model_type") != "CrossEncoder" or not isinstance(modules, list):
        return None
    if len(modules) < 2 or _type_of(modules[0]) != "Transformer":
        return None
    path = str(modules[0].get("path", ""))
    config = Source(source.name, path, source.trust_remote_code).read_json("sentence_bert_config.json")
    return (
        (path, modules) if isinstance(config, dict) and config.get("transformer_task") == "feature-extraction" else None
    )


def _type_of(module: Any) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1] if isinstance(module, dict) else ""


class _Pool(nn.Module):
    def __init__(self, mode: Pooling) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, features: Features) -> Features:
        features[_EMBEDDING] = pool(self.mode, features["token_embeddings"], features["attention_mask"])
        return features


class _Dense(nn.Module):
    def __init__(self, config: dict[str, Any], activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.linear = nn.Linear(config["in_features"], config["out_features"], bias=config.get("bias", True))
        # sentence-transformers' attribute names: its saved state (a PReLU's weight included) loads as it is.
        self.activation_function = activation
        self.source = config.get("module_input_name", _EMBEDDING)
        self.target = config.get("module_output_name") or self.source
        self.residual: nn.Module | None = None
        if config.get("use_residual", False):
            same = config["in_features"] == config["out_features"]
            self.residual = (
                nn.Identity() if same else nn.Linear(config["in_features"], config["out_features"], bias=False)
            )

    def forward(self, features: Features) -> Features:
        x = features[self.source]
        out = self.activation_function(self.linear(x))
        features[self.target] = out if self.residual is None else out + self.residual(x)
        return features


class _LayerNorm(nn.Module):
    def __init__(self, dimension: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dimension)

    def forward(self, features: Features) -> Features:
        features[_EMBEDDING] = self.norm(features[_EMBEDDING])
        return features


class _Normalize(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.source = config.get("module_input_name", _EMBEDDING)
        self.target = config.get("module_output_name") or self.source

    def forward(self, features: Features) -> Features:
        if (x := features.get(self.source)) is not None:
            features[self.target] = nn.functional.normalize(x, p=2, dim=-1)
        return features


class ModularCrossEncoder(nn.Module):
    """The backbone and the head as one module, called as a transformers model is: its ``logits`` are the head's
    ``scores`` (one per row)."""

    def __init__(self, backbone: nn.Module, head: list[nn.Module], input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.ModuleList(head)
        self.input_names = input_names

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        passed = {name: value for name, value in inputs.items() if name in self.input_names}
        hidden = self.backbone(**passed).last_hidden_state
        features: Features = {"token_embeddings": hidden, "attention_mask": inputs["attention_mask"]}
        for module in self.head:
            features = module(features)
        if "scores" not in features:
            raise RuntimeError("the CrossEncoder's head wrote no scores")
        return {"logits": features["scores"].float()}


def read_head(source: Source, modules: list[Any], device: torch.device, dtype: torch.dtype) -> list[nn.Module]:
    """The head modules after the transformer (``modules`` is its modules.json), built from their folders' configs
    and weights (on the meta device: their shapes only)."""
    head: list[nn.Module] = []
    for entry in modules[1:]:
        kind, path = _type_of(entry), str(entry.get("path", ""))
        folder = Source(source.name, path, source.trust_remote_code)
        config: Any = folder.read_json("config.json") or {}
        if kind == "Pooling":
            head.append(_Pool(read_pooling(folder, source.name)))
        elif kind == "Dense":
            activation = module_at(config.get("activation_function") or "torch.nn.Identity", source.name)
            head.append(_Dense(config, activation))
        elif kind == "LayerNorm":
            head.append(_LayerNorm(config["dimension"]))
        elif kind == "Normalize":
            head.append(_Normalize(config))
        elif kind == "Dropout":
            continue  # inference: nothing
        else:  # a module scorekit cannot run
            raise ValueError(
                f"Model {source.name!r} has a {kind or 'nameless'} module in its CrossEncoder head, which scorekit"
                " cannot run."
            )
        if device.type != "meta" and any(True for _ in head[-1].parameters()):
            head[-1].load_state_dict(_weights(folder, source.name))
        head[-1].to(device=device, dtype=dtype)
    if not head:
        raise ValueError(f"Model {source.name!r} lists no head after its transformer.")
    return head


def _weights(folder: Source, name: str) -> dict[str, torch.Tensor]:
    with loading(name):
        path = cached_file(folder.name, "model.safetensors", **folder.kwargs())
    if path is None:
        raise ValueError(f"Model {name!r}: the head module in {folder.subfolder!r} has no model.safetensors.")
    return load_file(path)
