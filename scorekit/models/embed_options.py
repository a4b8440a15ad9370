"""What an embedding request may ask of a bi-encoder beyond its texts, checked against the model's own files
before any tokenizing: one of its saved prompts before each text (sentence-transformers' ``prompts``), and a
Matryoshka cut of its vector (``dimensions``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PretrainedConfig, PreTrainedTokenizerBase

from scorekit.errors import InvalidRequest
from scorekit.tasks import Dimensions, Prompt

from .files import Source

# The prompts every SentenceTransformer knows, empty unless the model saved them: ``encode(prompt_name="query")``
# works on any model, and ``encode_query`` never falls back to the default prompt.
ALWAYS_KNOWN = {"query": "", "document": ""}


@dataclass(frozen=True, slots=True)
class SavedPrompts:
    """config_sentence_transformers.json's ``prompts`` and ``default_prompt_name``, as SentenceTransformer
    resolves them: a request that names no prompt gets the default one (none when there is no default)."""

    prompts: dict[str, str]
    default: str | None = None

    @classmethod
    def read(cls, source: Source) -> SavedPrompts:
        """The model's prompts; a default that names no prompt stops the start-up, as it stops
        SentenceTransformer's load."""
        config: Any = source.read_json("config_sentence_transformers.json")
        config = config if isinstance(config, dict) else {}
        saved = {str(name): str(text) for name, text in (config.get("prompts") or {}).items() if text is not None}
        prompts = {**ALWAYS_KNOWN, **saved}
        default = config.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise ValueError(
                f"Model {source.name!r} has default_prompt_name {default!r}, which is none of its prompts "
                f"{sorted(prompts)}."
            )
        return cls(prompts, default)

    def text(self, asked: Prompt | None) -> str:
        """The text that goes before each input ("" for none)."""
        if asked is None:
            return self.prompts[self.default] if self.default is not None else ""
        if asked.name in self.prompts:
            return self.prompts[asked.name]
        if asked.if_saved:
            return ""
        raise InvalidRequest(
            f"The model has no prompt named {asked.name!r}; its prompts are {sorted(self.prompts)}.", asked.field
        )


def prompt_length(tokenizer: PreTrainedTokenizerBase, prompt: str) -> int:
    """How many leading tokens of a prompted input are the prompt's, as sentence-transformers counts them for a
    Pooling module with ``include_prompt: false``: the prompt tokenized alone with its special tokens, less a
    trailing special token (the [CLS] before it is counted, the [SEP] after it is not)."""
    ids: list[int] = tokenizer(prompt)["input_ids"]
    return len(ids) - 1 if ids and ids[-1] in tokenizer.all_special_ids else len(ids)


@dataclass(frozen=True, slots=True)
class Matryoshka:
    """Which ``dimensions`` a model's vector may be cut to. The transformer's config.json may say it, as vLLM
    reads it: ``matryoshka_dimensions`` lists the sizes it was trained for, ``is_matryoshka: false`` says it
    was trained for none. A config that says nothing allows any size from 1 to the width: the client knows
    its model. The full width is always allowed: it cuts nothing."""

    width: int
    sizes: tuple[int, ...] | None = None
    trained: bool | None = None

    @classmethod
    def of(cls, config: PretrainedConfig) -> Matryoshka:
        text = config.get_text_config()
        sizes = getattr(text, "matryoshka_dimensions", None)
        trained = getattr(text, "is_matryoshka", None)
        return cls(
            int(text.hidden_size),
            tuple(int(size) for size in sizes) if sizes is not None else None,
            bool(trained) if trained is not None else None,
        )

    def check(self, asked: Dimensions) -> int:
        """The size to cut to, or the request's error naming its field."""
        size, field = asked.size, asked.field
        if not 1 <= size <= self.width:
            raise InvalidRequest(
                f"{field} must be between 1 and {self.width} (the model's embedding size), got {size}.", field
            )
        if size == self.width:
            return size
        if self.sizes is not None and size not in self.sizes:
            raise InvalidRequest(
                f"The model was trained to be shortened to {list(self.sizes)} dimensions only (its config's "
                f"matryoshka_dimensions), or its full {self.width}; {field} {size} is none of them.",
                field,
            )
        if self.sizes is None and self.trained is False:
            raise InvalidRequest(
                f"The model's config says it was not trained to be shortened (is_matryoshka: false), so a cut "
                f"vector would be no embedding: leave {field} out, or give its full {self.width}.",
                field,
            )
        return size
