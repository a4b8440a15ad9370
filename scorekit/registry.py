"""The models one app serves: a request's ``model`` field resolved to that model's engine.

Each model has its own :class:`~scorekit.engine.Engine` (batcher, worker thread, limits), so a dead worker
or a long queue on one model turns away only that model's requests. A request that names no model gets the
first one; a name the server does not serve is vLLM's 404.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scorekit.errors import NotReady, UnknownModel
from scorekit.logs import note_model
from scorekit.settings import ModelSpec

if TYPE_CHECKING:  # a type here only: the endpoints reach an engine through the registry and load no torch
    from scorekit.engine import Engine


@dataclass(frozen=True, slots=True)
class Served:
    """One model as the server holds it: what was asked for, and its engine once it is loaded."""

    spec: ModelSpec
    engine: Engine | None

    @property
    def name(self) -> str:
        return self.spec.served_name


class ModelRegistry:
    """The served models in their configured order; engines arrive as each model loads."""

    def __init__(self, specs: tuple[ModelSpec, ...]) -> None:
        if not specs:
            raise ValueError("a registry serves at least one model")
        self._specs = {spec.served_name: spec for spec in specs}
        self._engines: dict[str, Engine] = {}
        self.default = specs[0].served_name

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def __iter__(self) -> Iterator[Served]:
        for name, spec in self._specs.items():
            yield Served(spec, self._engines.get(name))

    def add(self, name: str, engine: Engine) -> None:
        if name not in self._specs:
            raise KeyError(f"{name!r} is not a served model")
        self._engines[name] = engine

    def remove(self, name: str) -> Engine | None:
        return self._engines.pop(name, None)

    def get(self, name: str) -> Engine | None:
        """The engine of a served model, loaded or not ready; None before it loads."""
        return self._engines.get(name)

    def resolve(self, model: str | None) -> tuple[str, Engine]:
        """The served name and the engine for a request's ``model`` (None or empty: the default model).

        An unknown name is :class:`UnknownModel` (404); a model not loaded yet, or whose worker died, is
        :class:`NotReady` (503), whatever the other models' state. A served name is the request's model in its
        log record (``logs.note_model``), answered or not."""
        name = model or self.default
        if name not in self._specs:
            raise UnknownModel(name)
        note_model(name)  # the request's log lines and access line name it from now on
        engine = self._engines.get(name)
        if engine is None or not engine.ready:
            raise NotReady("The model is not ready." if len(self._specs) == 1 else f"The model `{name}` is not ready.")
        return name, engine
