"""A sentence-transformers SparseEncoder folder, read as SparseEncoder loads it: which module is the masked-LM (the
MLMTransformer, or a Transformer whose task is fill-mask), how its SpladePooling pools, an inference-free model's
Router (its queries' SparseStaticEmbedding and their IDF-like weights), and what its saved config asks of every
vector (``max_active_dims``) and of a score (``similarity_fn_name``).

A layout scorekit cannot compute exactly is refused in one line naming its module (a CSR model's
SparseAutoEncoder, a Router of other routes), never served as a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

import torch
from safetensors import safe_open
from transformers.utils.hub import cached_file

from .files import Source, loading

Strategy = Literal["max", "sum"]
Activation = Literal["relu", "log1p_relu"]
Route = Literal["query", "document"]
# What sentence-transformers names a SparseEncoder's modules by (the class name, its module path left out).
ROUTERS = ("Router", "Asym")  # Asym: the Router's older name
MLMS = ("MLMTransformer", "Transformer")
SPARSE_MODULES = ("SpladePooling", "SparseStaticEmbedding", "SparseAutoEncoder", "MLMTransformer")
# sentence-transformers' SpladePooling settings.
_STRATEGIES: tuple[Strategy, ...] = ("max", "sum")
_ACTIVATIONS: tuple[Activation, ...] = ("relu", "log1p_relu")


@dataclass(frozen=True, slots=True)
class SpladeHead:
    """SpladePooling: each token's logits through ReLU then log1p (``log1p_relu``: log1p once more), padding
    zeroed, then the maximum (or the sum) over the tokens."""

    strategy: Strategy = "max"
    activation: Activation = "relu"

    @classmethod
    def read(cls, folder: Source) -> SpladeHead:
        config: Any = folder.read_json("config.json")
        config = config if isinstance(config, dict) else {}
        strategy = config.get("pooling_strategy", "max")
        activation = config.get("activation_function", "relu")
        if strategy not in _STRATEGIES or activation not in _ACTIVATIONS:
            raise ValueError(
                f"Model {folder.name!r} has a SpladePooling of pooling_strategy {strategy!r} and activation_function"
                f" {activation!r}; sentence-transformers knows {list(_STRATEGIES)} and {list(_ACTIVATIONS)}."
            )
        return cls(strategy, activation)


@dataclass(frozen=True, slots=True)
class SparseLayout:
    """Where the masked-LM's files are (``mlm``, a folder of the model; "" its root), its pooling, and for an
    inference-free model the folder of the SparseStaticEmbedding its queries take (``query_route``) and the route
    ``encode`` takes without a task (``default_route``; None: such an encode is refused, as sentence-transformers
    refuses it). ``modules`` says what modules.json lists, for the start-up log."""

    mlm: str
    head: SpladeHead
    modules: str
    query_route: str | None = None
    default_route: Route | None = "document"


def sparse_modules(source: Source) -> str | None:
    """Why ``source`` is a SparseEncoder, in the start-up log's words, or None when it is not one: modules.json
    lists a sparse module (SpladePooling, an MLMTransformer, a SparseStaticEmbedding, a SparseAutoEncoder), itself
    or inside a Router."""
    modules = _modules(source)
    listed = _listed(source, modules)
    routed = [name for module in modules if _type(module) in ROUTERS for name in _inner(source, _path(module))]
    if any(name in SPARSE_MODULES for name in [*map(_type, modules), *routed]):
        return f"modules.json lists {listed} (a SparseEncoder)"
    return None


def read_layout(source: Source) -> SparseLayout:
    """The folder's layout; a folder without modules.json is a plain masked-LM, which SparseEncoder pools with
    SpladePooling's defaults (max, relu)."""
    modules = _modules(source)
    listed = _listed(source, modules)
    if not modules:
        return SparseLayout("", SpladeHead(), "none (a plain masked-LM: SpladePooling max, relu)")
    if len(modules) == 1 and _type(modules[0]) in ROUTERS:
        return _routed(source, _path(modules[0]), listed)
    names = [_type(module) for module in modules]
    if len(names) != 2 or names[0] not in MLMS or names[1] != "SpladePooling":
        raise _refused(source, f"modules.json lists {listed}")
    mlm, pooling = (_path(module) for module in modules)
    _check_mlm(source, mlm, names[0])
    return SparseLayout(mlm, SpladeHead.read(Source(source.name, pooling)), listed)


def _routed(source: Source, router: str, listed: str) -> SparseLayout:
    """An inference-free model: a Router whose "query" route is one SparseStaticEmbedding and whose "document"
    route is a masked-LM and its SpladePooling (what ``Router.for_query_document`` saves), routed by task alone."""
    config = _router_config(source, router)
    types: dict[str, str] = {key: str(value).rsplit(".", 1)[-1] for key, value in config.get("types", {}).items()}
    structure: dict[str, list[str]] = config.get("structure", {})
    parameters: dict[str, Any] = config.get("parameters", {})
    query = [types.get(key, "?") for key in structure.get("query", [])]
    document = [types.get(key, "?") for key in structure.get("document", [])]
    routes = "; ".join(
        f"{route}: {', '.join(types.get(key, '?') for key in keys)}" for route, keys in structure.items()
    )
    if (
        set(structure) != {"query", "document"}
        or parameters.get("route_mappings")
        or query != ["SparseStaticEmbedding"]
        or len(document) != 2
        or document[0] not in MLMS
        or document[1] != "SpladePooling"
    ):
        raise _refused(source, f"modules.json lists {listed}, whose routes are {routes}")
    mlm, pooling = (_join(router, key) for key in structure["document"])
    _check_mlm(source, mlm, document[0])
    default = parameters.get("default_route")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(structure))
    if default not in (None, "query", "document"):
        raise _refused(source, f"its Router's default_route {default!r} is none of its routes")
    return SparseLayout(
        mlm,
        SpladeHead.read(Source(source.name, pooling)),
        listed,
        query_route=_join(router, structure["query"][0]),
        default_route=default,
    )


def _refused(source: Source, found: str) -> ValueError:
    return ValueError(
        f"Model {source.name!r} is a SparseEncoder scorekit cannot serve: {found}; it serves SPLADE (a masked-LM, then"
        " SpladePooling), and an inference-free SPLADE's Router (queries: a SparseStaticEmbedding; documents: a"
        " masked-LM, then SpladePooling)."
    )


def _check_mlm(source: Source, folder: str, module: str) -> None:
    """A Transformer before SpladePooling must give the vocabulary's logits: its task must be fill-mask."""
    if module != "Transformer":
        return
    config: Any = Source(source.name, folder).read_json("sentence_bert_config.json")
    task = config.get("transformer_task") if isinstance(config, dict) else None
    if task != "fill-mask":
        raise _refused(source, f"its Transformer's transformer_task is {task!r}, not 'fill-mask'")


def _modules(source: Source) -> list[Any]:
    modules: Any = source.read_json("modules.json")
    return [module for module in modules if isinstance(module, dict)] if isinstance(modules, list) else []


def _listed(source: Source, modules: list[Any]) -> str:
    """modules.json's module types by class name, in order; a Router's own modules after it, in parentheses."""
    names = []
    for module in modules:
        name = _type(module)
        names.append(f"{name} ({', '.join(_inner(source, _path(module)))})" if name in ROUTERS else name)
    return ", ".join(names)


def _inner(source: Source, router: str) -> list[str]:
    """The class names of a Router's modules, in its config's order."""
    return [str(kind).rsplit(".", 1)[-1] for kind in _router_config(source, router).get("types", {}).values()]


def _router_config(source: Source, router: str) -> dict[str, Any]:
    """The Router's saved config (router_config.json; an older one: config.json), as sentence-transformers reads it."""
    folder = Source(source.name, router)
    config: Any = folder.read_json("router_config.json") or folder.read_json("config.json")
    return config if isinstance(config, dict) else {}


def _type(module: dict[str, Any]) -> str:
    return str(module.get("type", "?")).rsplit(".", 1)[-1]


def _path(module: dict[str, Any]) -> str:
    return str(module.get("path", ""))


def _join(folder: str, name: str) -> str:
    return str(PurePosixPath(folder, name)) if folder else name


@dataclass(frozen=True, slots=True)
class SavedSparse:
    """What config_sentence_transformers.json asks of a SparseEncoder: ``max_active_dims`` keeps each vector's
    largest weights only (SparseEncoder's ``encode`` prunes every vector so), and the similarity must be the dot
    product (sentence-transformers' default for sparse vectors), the only one scorekit scores with."""

    max_active_dims: int | None = None

    @classmethod
    def read(cls, source: Source) -> SavedSparse:
        config: Any = source.read_json("config_sentence_transformers.json")
        config = config if isinstance(config, dict) else {}
        similarity = config.get("similarity_fn_name")
        if similarity not in (None, "dot"):
            raise ValueError(
                f"Model {source.name!r} saves similarity_fn_name {similarity!r}; scorekit scores a SparseEncoder by"
                " the dot product only (sentence-transformers' default for it)."
            )
        keep = config.get("max_active_dims")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep <= 0):
            raise ValueError(f"Model {source.name!r} saves max_active_dims {keep!r}, which is no positive integer.")
        return cls(keep)


def static_weights(folder: Source) -> torch.Tensor:
    """A SparseStaticEmbedding's weight per token id (float32), from its model.safetensors."""
    with loading(folder.name):
        path = cached_file(
            folder.name,
            "model.safetensors",
            **folder.kwargs(),
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    if path is not None:
        with safe_open(path, framework="pt") as saved:
            if "weight" in saved.keys():  # noqa: SIM118  # safe_open is no mapping: keys() is its only listing
                weight: torch.Tensor = saved.get_tensor("weight")
                return weight.float()
    raise ValueError(
        f"Model {folder.name!r} has a SparseStaticEmbedding in {folder.subfolder!r} without a weight in its"
        " model.safetensors; scorekit reads the weights sentence-transformers saves there."
    )
