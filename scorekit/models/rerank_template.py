"""How a causal LM is asked whether a document answers a query: the prompt template and its label tokens.

A template is a few segments, each tokenized on its own and joined in order, as the published recipes do
(Qwen3-Reranker tokenizes its system prefix, the instruction/query/document body and the assistant suffix
apart; bge-reranker-v2-gemma its ``A:`` query, ``B:`` passage, separators and prompt). Segments name the
slots ``{query}``, ``{document}`` and ``{instruction}``; ``{document}`` appears exactly once, so the document's
tokens are one run that truncation and chunking can cut without touching the rest.

Two labels (``["no", "yes"]``) score P(second) as the softmax over the two logits at the last prompt position,
and ``use_activation: false`` answers their difference (what vLLM's folded two-token classifier gives). One
label (``["Yes"]``) scores the sigmoid of its logit, and the raw logit without activation (FlagEmbedding's
``normalize=True`` and default outputs).

A template comes from (first found): ``--reranker-template`` (a preset name or a JSON file), a
``reranker_template.json`` beside the weights, the preset its name says (``mxbai-rerank``), or the preset of the
model's ``model_type``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATE_FILE = "reranker_template.json"
SLOTS = ("query", "document", "instruction")
_SLOT = re.compile(r"\{(query|document|instruction)\}")


@dataclass(frozen=True, slots=True)
class RerankTemplate:
    """The prompt and labels of an LLM reranker (see the module docstring)."""

    segments: tuple[str, ...]
    labels: tuple[str, ...]
    instruction: str = ""  # the instruction slot's text when a request gives none
    bos: bool = False  # start with the tokenizer's BOS token (the recipe adds it by hand)
    # What fills the instruction slot when there is an instruction ("{instruction}" is its text); with none (empty),
    # the slot is empty: mxbai-rerank-v2 writes a line "instruction: ...\n" before its query only when asked.
    instruction_format: str = "{instruction}"

    def __post_init__(self) -> None:
        slots = [match.group(1) for segment in self.segments for match in _SLOT.finditer(segment)]
        for slot in ("query", "document"):
            if slots.count(slot) != 1:
                raise ValueError(
                    f"A reranker template needs {{{slot}}} exactly once, found it {slots.count(slot)} times."
                )
        if len(self.labels) not in (1, 2) or not all(self.labels):
            raise ValueError('A reranker template needs one label ("Yes") or two ("no", "yes"), each a token.')
        if self.instruction_format.count("{instruction}") != 1:
            raise ValueError("A reranker template's instruction_format needs {instruction} exactly once.")

    def fill(self, query: str, document: str, instruction: str | None) -> list[Filled]:
        """Each segment's text, and where each slot's value sits in it."""
        text = self.instruction if instruction is None else instruction
        values = {
            "query": query,
            "document": document,
            "instruction": self.instruction_format.replace("{instruction}", text) if text else "",
        }
        return [_fill(segment, values) for segment in self.segments]


# A filled segment's text, and the character span of each slot's value in it.
Filled = tuple[str, dict[str, tuple[int, int]]]


def _fill(segment: str, values: dict[str, str]) -> Filled:
    parts, spans, length = [], {}, 0
    for place, piece in enumerate(_SLOT.split(segment)):  # literal, slot name, literal, ...
        text = values[piece] if place % 2 else piece
        if place % 2:
            spans[piece] = (length, length + len(text))
        parts.append(text)
        length += len(text)
    return "".join(parts), spans


QWEN3_RERANKER = RerankTemplate(
    segments=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
        "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    labels=("no", "yes"),
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)

BGE_RERANKER_GEMMA = RerankTemplate(
    segments=("A: {query}", "\n", "B: {document}", "\n", "{instruction}"),
    labels=("Yes",),
    instruction=(
        "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
        "providing a prediction of either 'Yes' or 'No'."
    ),
    bos=True,
)

# mixedbread's MxbaiRerankV2 recipe: a Qwen2 chat prompt, its pieces tokenized apart (the system prefix, the
# query line with its optional instruction line, the separator, the document line, the separator, the task and
# the assistant suffix), and the labels "0" and "1": P("1") by the two-way softmax, their logits' difference (what
# its predict returns) without activation.
MXBAI_RERANK_V2 = RerankTemplate(
    segments=(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n",
        "{instruction}query: {query}",
        "\n",
        "document: {document}",
        "\n",
        "You are a search relevance expert who evaluates how well documents match search queries. For each"
        " query-document pair, carefully analyze the semantic relationship between them, then provide your binary"
        " relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:",
        "<|im_end|>\n<|im_start|>assistant\n",
    ),
    labels=("0", "1"),
    instruction_format="instruction: {instruction}\n",
)

PRESETS = {
    "qwen3-reranker": QWEN3_RERANKER,
    "bge-reranker-v2-gemma": BGE_RERANKER_GEMMA,
    "mxbai-rerank-v2": MXBAI_RERANK_V2,
}
# The preset a model of this config ``model_type`` gets when no template is given.
PRESET_OF_MODEL_TYPE = {"qwen3": "qwen3-reranker", "gemma": "bge-reranker-v2-gemma"}
# The preset a model gets by its name (its folder's or hub name's last part) before its model_type: mxbai-rerank-v2
# is a Qwen2 model, whose model_type says nothing of the recipe.
PRESET_OF_NAME = {"mxbai-rerank": "mxbai-rerank-v2"}


def parse_template(raw: Any, where: str) -> RerankTemplate:
    """A template from its JSON form (the fields of :class:`RerankTemplate`), or a ValueError naming ``where``."""
    known = {"segments", "labels", "instruction", "bos", "instruction_format"}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a reranker template is a JSON object with segments and labels.")
    if unknown := sorted(set(raw) - known):
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; a template has {', '.join(sorted(known))}.")
    segments, labels = raw.get("segments"), raw.get("labels")
    if not isinstance(segments, list) or not isinstance(labels, list) or not _strings(segments + labels):
        raise ValueError(f"{where}: segments and labels must be non-empty lists of strings.")
    instruction, bos = raw.get("instruction", ""), raw.get("bos", False)
    instruction_format = raw.get("instruction_format", "{instruction}")
    if not isinstance(instruction, str) or not isinstance(bos, bool) or not isinstance(instruction_format, str):
        raise ValueError(f"{where}: instruction and instruction_format must be strings and bos true or false.")
    try:
        return RerankTemplate(tuple(segments), tuple(labels), instruction, bos, instruction_format)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _strings(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(item, str) for item in values)


def resolve_template(
    given: str | None, beside_weights: Any, model_type: str | None, name: str
) -> tuple[RerankTemplate, str]:
    """The template of a model and where it came from (for the start-up log): ``given`` (a preset name or a
    JSON file), else the file beside the weights (its parsed JSON, or None), else the preset its name says, else
    the preset of ``model_type``."""
    if given is not None:
        if given in PRESETS:
            return PRESETS[given], f"preset {given}"
        path = Path(given)
        if not path.is_file():
            raise ValueError(f"Reranker template {given!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file.")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"Reranker template {given!r} could not be read: {exc}") from None
        return parse_template(raw, f"Reranker template {given!r}"), f"file {given}"
    if beside_weights is not None:
        return parse_template(beside_weights, f"{TEMPLATE_FILE} of model {name!r}"), f"the model's {TEMPLATE_FILE}"
    last = name.rstrip("/").rsplit("/", 1)[-1].lower()
    for part, preset in PRESET_OF_NAME.items():
        if part in last:
            return PRESETS[preset], f"preset {preset} (by its name)"
    if model_type in PRESET_OF_MODEL_TYPE:
        preset = PRESET_OF_MODEL_TYPE[model_type]
        return PRESETS[preset], f"preset {preset} (model_type {model_type})"
    raise ValueError(
        f"Model {name!r} (model_type {model_type!r}) has no {TEMPLATE_FILE} and no preset: give one with "
        f"--reranker-template ({', '.join(PRESETS)}, or a JSON file; see docs/models.md)."
    )
