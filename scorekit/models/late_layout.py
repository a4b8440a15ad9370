"""What a late-interaction (ColBERT) folder says about turning a text into token vectors, read from whichever of
the three layouts people ship it in, into one :class:`Layout` the backend runs:

- **PyLate**: a Sentence-Transformers folder (modules.json: the Transformer, then Dense projections; PyLate's
  own ``pylate.models.Dense.Dense`` or sentence-transformers') with PyLate's keys in
  config_sentence_transformers.json: ``query_prefix``/``document_prefix`` (tokens inserted after the first one,
  "[Q] " and "[D] " unless saved otherwise), ``query_length``/``document_length`` (32/180), ``do_query_expansion``
  and ``attend_to_expansion_tokens`` (a query padded with [MASK] to its length, attention not seeing them), and
  ``skiplist_words`` (string.punctuation: their tokens dropped from a document's vectors). As
  ``pylate.models.ColBERT`` reads them (pylate 1.6), a text stripped (and lowercased with ``do_lower_case``), the
  model's default prompt before it.
- **Stanford ColBERT** (colbert-ir): config.json's architectures ``HF_ColBERT``, a backbone whose checkpoint also
  holds ``linear.weight`` (the projection, no bias), and artifact.metadata with ``query_maxlen``, ``doc_maxlen``,
  ``query_token_id``/``doc_token_id`` ("[unused0]"/"[unused1]"), ``attend_to_mask_tokens`` and
  ``mask_punctuation``; the defaults colbert-ai and PyLate share (32, 180, the markers above, punctuation masked)
  where the file is missing. Its ``similarity`` must be "cosine" (an "l2" checkpoint scores otherwise).
- **Sentence-Transformers' MultiVectorEncoder** (v6): modules.json lists the Transformer (its
  sentence_bert_config.json has ``query_length``, ``document_length`` and ``query_expansion``: strategy "fixed"
  or "min", ``attend``, ``token``, ``length``), Dense projections on token embeddings, a ``MultiVectorMask``
  (``skiplist_words`` for the ``skiplist_tasks``) and a token-level ``Normalize``; the "query" and "document"
  prompts go before the texts as text, and ``similarity_fn_name`` may be "meanmaxsim" (MaxSim over the query's
  token count) and ``truncate_dim`` cut the vectors (then normalized again).

Every layout normalizes each token vector. A module or option scorekit cannot run as its library does (token
pooling, an image-patch allowlist, a text lowercased by a tokenizer normalizer, left padding under query expansion)
stops the start-up in one line naming it: a score is never computed without it.
"""

from __future__ import annotations

import string
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.utils.hub import cached_file

from .activations import module_at
from .files import Source, loading

PYLATE = "PyLate"
STANFORD = "Stanford ColBERT"
MULTI_VECTOR = "Sentence-Transformers' MultiVectorEncoder"
# The keys PyLate writes into config_sentence_transformers.json beside sentence-transformers' own.
_PYLATE_KEYS = (
    "query_prefix",
    "document_prefix",
    "query_length",
    "document_length",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "skiplist_words",
)
# PyLate's and colbert-ai's defaults, where a folder saves none.
QUERY_LENGTH, DOCUMENT_LENGTH = 32, 180
PYLATE_MARKERS = ("[Q] ", "[D] ")
STANFORD_MARKERS = ("[unused0]", "[unused1]")
_IDENTITY = "torch.nn.modules.linear.Identity"


def layout_of(source: Source) -> tuple[str, str] | None:
    """Which layout the folder is in and why (the start-up log's words), or None: no late-interaction model.
    Read from its JSON files alone, before any weights."""
    config: Any = source.read_json("config.json")
    if isinstance(config, dict) and "HF_ColBERT" in (config.get("architectures") or []):
        return STANFORD, "config.json's architectures name HF_ColBERT (a Stanford ColBERT checkpoint)"
    saved: Any = source.read_json("config_sentence_transformers.json")
    saved = saved if isinstance(saved, dict) else {}
    modules: Any = source.read_json("modules.json")
    types = [str(module.get("type", "")) for module in modules or [] if isinstance(module, dict)]
    if saved.get("model_type") == "MultiVectorEncoder":
        return MULTI_VECTOR, "config_sentence_transformers.json's model_type is MultiVectorEncoder"
    if any(name.endswith("MultiVectorMask") for name in types):
        return MULTI_VECTOR, "modules.json lists a MultiVectorMask (a MultiVectorEncoder)"
    if saved.get("model_type") == "ColBERT":
        return PYLATE, "config_sentence_transformers.json's model_type is ColBERT (a PyLate ColBERT)"
    if pylate := [name for name in types if name.startswith("pylate.")]:
        return PYLATE, f"modules.json lists {pylate[0]} (a PyLate ColBERT)"
    found = [key for key in _PYLATE_KEYS if key in saved]
    if found and isinstance(modules, list):
        return PYLATE, f"config_sentence_transformers.json has PyLate's {', '.join(found[:2])} (a PyLate ColBERT)"
    return None


def transformer_folder(source: Source) -> str:
    """The folder of the model's transformer: modules.json's first Transformer module's, else the model's own."""
    modules: Any = source.read_json("modules.json")
    for module in modules or []:
        if isinstance(module, dict) and str(module.get("type", "")).rsplit(".", 1)[-1] == "Transformer":
            return str(module.get("path", ""))
    return ""


@dataclass(frozen=True, slots=True)
class Expansion:
    """ColBERT's query expansion: a query of fewer than ``length`` tokens is padded to it with the ``token`` id
    (PyLate's and ColBERT's [MASK]), whose vectors count in MaxSim; ``attend``: whether attention sees them
    (ColBERT's default is not). ``fixed``: ``length`` is also the most a query holds (PyLate, ColBERT, and
    sentence-transformers' "fixed"); else (its "min") a longer query keeps its own limit."""

    length: int
    token: int
    attend: bool
    fixed: bool
    named: str  # the token, as the start-up log names it


@dataclass(frozen=True, slots=True)
class Role:
    """How a query's or a document's text becomes one model input, and which of its tokens' vectors count.

    ``prompt`` goes before the text (then ``strip`` and ``lower`` apply, as sentence-transformers 5 tokenizes
    for PyLate); the input is the tokenizer's leading special tokens, ``marker`` (PyLate's and ColBERT's inserted
    [Q]/[D] token), the text's tokens and the trailing special tokens, at most ``limit`` tokens in all. The
    vectors of ``skip`` ids (a document's punctuation) do not count."""

    marker: array[int]
    prompt: str
    strip: bool
    lower: bool
    limit: int
    skip: frozenset[int]
    marker_text: str = ""  # the marker token, as the start-up log names it

    @property
    def said(self) -> str:
        """What goes before the text, as the start-up log says it."""
        if self.marker:
            return f"the marker {self.marker_text!r}"
        return f"the prompt {self.prompt!r}" if self.prompt else "no marker"

    def text(self, given: str) -> str:
        text = self.prompt + given
        text = text.strip() if self.strip else text
        return text.lower() if self.lower else text


@dataclass(frozen=True, slots=True)
class Layout:
    """One folder's recipe: where its transformer is, how each role is encoded, its query expansion, the
    projections after the transformer (in order), and how MaxSim is finished."""

    name: str
    transformer: str  # the transformer's folder in the model's
    query: Role
    document: Role
    expansion: Expansion | None
    projections: list[Projection]
    mean: bool  # MeanMaxSim: the sum over query tokens divided by their count
    dimensions: int | None  # each vector cut to its first this many values, then normalized again
    length_from: str  # where the document limit (the model's maximum input length) was read


def read_layout(
    source: Source, tokenizer: PreTrainedTokenizerBase, own_length: int, device: torch.device, dtype: torch.dtype
) -> Layout:
    """The folder's layout resolved against its tokenizer; ``own_length`` is the longest input its transformer
    takes (positions, tokenizer). Projections are loaded on ``device`` in ``dtype`` (on the meta device: shapes
    only)."""
    found = layout_of(source)
    if found is None:
        raise ValueError(f"Model {source.name!r} is no late-interaction model: no ColBERT layout was found.")
    reader = {PYLATE: _pylate, STANFORD: _stanford, MULTI_VECTOR: _multi_vector}[found[0]]
    layout = reader(_Reading(source, tokenizer, own_length, device, dtype))
    if layout.document.limit > own_length or layout.query.limit > own_length:
        longest = max(layout.document.limit, layout.query.limit)
        raise ValueError(
            f"Model {source.name!r} asks for inputs of {longest} tokens, but its transformer takes at most"
            f" {own_length}."
        )
    return layout


@dataclass(frozen=True, slots=True)
class _Reading:
    """What every layout reader needs."""

    source: Source
    tokenizer: PreTrainedTokenizerBase
    own_length: int
    device: torch.device
    dtype: torch.dtype

    @property
    def name(self) -> str:
        return self.source.name

    def marker(self, token: str, which: str) -> array[int]:
        """The one id of a marker token; "" is none. A marker the vocabulary lacks is refused: PyLate would add it
        with a fresh, untrained embedding."""
        if not token:
            return array("i")
        vocabulary = self.tokenizer.get_vocab()
        if token not in vocabulary:
            raise ValueError(
                f"The {which} marker {token!r} of model {self.name!r} is not a token of its tokenizer, so its"
                " embedding was never trained."
            )
        return array("i", [vocabulary[token]])

    def expansion(self, length: int, named: str | None, *, attend: bool, fixed: bool) -> Expansion:
        """Query expansion with PyLate's and sentence-transformers' pad token: the named token, else [MASK], else
        the end-of-sequence token."""
        tokenizer = self.tokenizer
        token = tokenizer.convert_tokens_to_ids(named) if named is not None else None
        for candidate in (token, tokenizer.mask_token_id, tokenizer.eos_token_id):
            if isinstance(candidate, int):
                text = str(tokenizer.convert_ids_to_tokens(candidate))
                return Expansion(length, candidate, attend, fixed, text)
        raise ValueError(f"Model {self.name!r} expands its queries, but its tokenizer has no [MASK] nor end token.")

    def expanded(self, expansion: Expansion | None) -> Expansion | None:
        if expansion is not None and self.tokenizer.padding_side != "right":
            raise ValueError(
                f"Model {self.name!r}'s tokenizer pads on the {self.tokenizer.padding_side}, which puts its query"
                " expansion before the query; scorekit places it after, as a right-padding tokenizer does."
            )
        return expansion

    def ids(self, words: list[str], *, known_only: bool) -> frozenset[int]:
        """The ids of skiplist words, as PyLate takes them (``convert_tokens_to_ids``, an unknown word then the
        unknown token's id) or, ``known_only``, as sentence-transformers does (unknown words dropped)."""
        unknown, unknown_token = self.tokenizer.unk_token_id, self.tokenizer.unk_token
        found = set()
        for word in words:
            token = self.tokenizer.convert_tokens_to_ids(word)
            if not isinstance(token, int) or (known_only and token == unknown and word != unknown_token):
                continue
            found.add(token)
        return frozenset(found)

    def projection(self, folder: Source, config: dict[str, Any]) -> Projection:
        """A Dense module (PyLate's or sentence-transformers'): a linear layer, its activation, its residual."""
        activation = module_at(str(config.get("activation_function") or _IDENTITY), self.name)
        dense = Projection(config["in_features"], config["out_features"], config.get("bias", True), activation)
        if config.get("use_residual", False):
            dense.with_residual()
        return self.placed(dense, lambda: _weights(folder, self.name))

    def placed(self, module: Projection, weights: Callable[[], dict[str, torch.Tensor]]) -> Projection:
        if self.device.type != "meta":
            module.load_state_dict(weights())
        return module.to(device=self.device, dtype=self.dtype).eval()


class Projection(nn.Module):
    """A Dense module on every token's vector, with sentence-transformers' (and PyLate's) attribute names, so its
    saved state loads as it is."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, activation: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation_function = activation
        self.residual: nn.Module | None = None

    def with_residual(self) -> None:
        """PyLate's ``use_residual``: the input added back, projected when the widths differ."""
        same = self.linear.in_features == self.linear.out_features
        self.residual = nn.Identity() if same else nn.Linear(self.linear.in_features, self.linear.out_features, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.activation_function(self.linear(x))
        return out if self.residual is None else out + self.residual(x)


def _pylate(reading: _Reading) -> Layout:
    source, name = reading.source, reading.name
    saved: Any = source.read_json("config_sentence_transformers.json") or {}
    modules: list[Any] = source.read_json("modules.json") or []
    transformer = ""
    projections: list[Projection] = []
    for index, module in enumerate(modules):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        path = str(module.get("path", ""))
        if index == 0 and kind == "Transformer":
            transformer = path
        elif kind == "Dense":
            folder = Source(name, path, source.trust_remote_code)
            projections.append(reading.projection(folder, folder.read_json("config.json") or {}))
        else:
            raise ValueError(f"Model {name!r} has a {kind or 'nameless'} module, which a PyLate ColBERT never has.")
    if not projections:
        raise ValueError(f"Model {name!r} has no Dense projection: PyLate would add an untrained one.")
    st_config: Any = Source(name, transformer).read_json("sentence_bert_config.json") or {}
    lower = bool(st_config.get("do_lower_case", False))
    prompts = saved.get("prompts") or {}
    default = saved.get("default_prompt_name")
    prompt = str(prompts.get(default) or "") if default is not None else ""
    expand = saved.get("do_query_expansion", True) is not False
    query_length = int(saved.get("query_length") or QUERY_LENGTH)
    document_length = int(saved.get("document_length") or DOCUMENT_LENGTH)
    words = saved.get("skiplist_words")
    skip = reading.ids(list(string.punctuation) if words is None else list(words), known_only=False)
    query_prefix = saved.get("query_prefix")
    document_prefix = saved.get("document_prefix")
    query_marker = PYLATE_MARKERS[0] if query_prefix is None else str(query_prefix)
    document_marker = PYLATE_MARKERS[1] if document_prefix is None else str(document_prefix)
    query = Role(reading.marker(query_marker, "query"), prompt, True, lower, query_length, frozenset(), query_marker)
    document = Role(
        reading.marker(document_marker, "document"), prompt, True, lower, document_length, skip, document_marker
    )
    attend = bool(saved.get("attend_to_expansion_tokens", False))
    expansion = reading.expansion(query_length, None, attend=attend, fixed=True) if expand else None
    where = "config_sentence_transformers.json's document_length" if "document_length" in saved else "PyLate's default"
    return Layout(PYLATE, transformer, query, document, reading.expanded(expansion), projections, False, None, where)


def _stanford(reading: _Reading) -> Layout:
    source, name = reading.source, reading.name
    metadata: Any = source.read_json("artifact.metadata") or {}
    similarity = metadata.get("similarity", "cosine")
    if similarity != "cosine":
        raise ValueError(
            f"Model {name!r} scores by {similarity!r} similarity (artifact.metadata); scorekit serves ColBERT's"
            " cosine MaxSim only."
        )
    query_length = int(metadata.get("query_maxlen") or QUERY_LENGTH)
    document_length = int(metadata.get("doc_maxlen") or DOCUMENT_LENGTH)
    masked = metadata.get("mask_punctuation", True)
    skip = reading.ids(list(string.punctuation), known_only=False) if masked else frozenset()
    query_marker = str(metadata.get("query_token_id") or STANFORD_MARKERS[0])
    document_marker = str(metadata.get("doc_token_id") or STANFORD_MARKERS[1])
    query = Role(reading.marker(query_marker, "query"), "", True, False, query_length, frozenset(), query_marker)
    document = Role(
        reading.marker(document_marker, "document"), "", True, False, document_length, skip, document_marker
    )
    attend = bool(metadata.get("attend_to_mask_tokens", False))
    expansion = reading.expansion(query_length, None, attend=attend, fixed=True)
    linear = _root_weight(source, "linear.weight")
    out_features, in_features = linear.shape
    projection = reading.placed(
        Projection(in_features, out_features, False, nn.Identity()), lambda: {"linear.weight": linear}
    )
    where = "artifact.metadata's doc_maxlen" if "doc_maxlen" in metadata else "ColBERT's default"
    return Layout(STANFORD, "", query, document, reading.expanded(expansion), [projection], False, None, where)


def _multi_vector(reading: _Reading) -> Layout:
    source, name = reading.source, reading.name
    saved: Any = source.read_json("config_sentence_transformers.json") or {}
    modules: list[Any] = source.read_json("modules.json") or []
    transformer: str | None = None
    projections: list[Projection] = []
    mask: dict[str, Any] | None = None
    normalized = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = Source(name, str(module.get("path", "")), source.trust_remote_code)
        config: Any = folder.read_json("config.json") or {}
        if kind == "Transformer" and transformer is None:
            transformer = folder.subfolder
        elif kind == "Dense" and config.get("module_input_name", "token_embeddings") == "token_embeddings":
            projections.append(reading.projection(folder, config))
        elif kind == "MultiVectorMask":
            mask = config
        elif kind == "Normalize" and config.get("module_input_name", "token_embeddings") == "token_embeddings":
            normalized = True
        else:
            raise ValueError(f"Model {name!r} has a {kind or 'nameless'} module, which scorekit cannot run.")
    if transformer is None or mask is None or not normalized:
        raise ValueError(
            f"Model {name!r} is a MultiVectorEncoder without a Transformer, a MultiVectorMask and a token-level"
            " Normalize, which scorekit serves only together."
        )
    if mask.get("keep_only_token_ids"):
        raise ValueError(f"Model {name!r} keeps only image-patch tokens (keep_only_token_ids); scorekit serves text.")
    st_config: Any = Source(name, transformer).read_json("sentence_bert_config.json") or {}
    if st_config.get("do_lower_case"):
        raise ValueError(f"Model {name!r} lowercases through its tokenizer's normalizer (do_lower_case).")
    own = min(int(st_config.get("max_seq_length") or reading.own_length), reading.own_length)
    query_length = int(st_config.get("query_length") or own)
    document_length = int(st_config.get("document_length") or own)
    expansion = None
    if (asked := st_config.get("query_expansion")) is not None:
        fixed = asked.get("strategy") == "fixed"
        length = int(asked["length"])
        expansion = reading.expansion(length, asked.get("token"), attend=bool(asked.get("attend")), fixed=fixed)
        query_length = length if fixed else max(query_length, length)
    skip = reading.ids(list(mask.get("skiplist_words") or []), known_only=True)
    tasks = mask.get("skiplist_tasks") or ["document"]
    tasks = [tasks] if isinstance(tasks, str) else tasks
    prompts = saved.get("prompts") or {}
    query = Role(
        array("i"),
        str(prompts.get("query") or ""),
        False,
        False,
        query_length,
        skip if "query" in tasks else frozenset(),
    )
    document = Role(
        array("i"),
        str(prompts.get("document") or ""),
        False,
        False,
        document_length,
        skip if "document" in tasks else frozenset(),
    )
    similarity = saved.get("similarity_fn_name")
    dimensions = saved.get("truncate_dim")
    where = f"{transformer}/sentence_bert_config.json's document_length".lstrip("/")
    return Layout(
        MULTI_VECTOR,
        transformer,
        query,
        document,
        reading.expanded(expansion),
        projections,
        similarity == "meanmaxsim",
        int(dimensions) if dimensions else None,
        where if "document_length" in st_config else "the model's maximum input length",
    )


def _weights(folder: Source, name: str) -> dict[str, torch.Tensor]:
    """A module folder's weights: model.safetensors, else pytorch_model.bin (older saves)."""
    for filename in ("model.safetensors", "pytorch_model.bin"):
        with loading(name):
            path = cached_file(folder.name, filename, **folder.kwargs(), _raise_exceptions_for_missing_entries=False)
        if path is not None:
            return _read(path)
    raise ValueError(f"Model {name!r}: the module in {folder.subfolder!r} has no weights.")


def _root_weight(source: Source, key: str) -> torch.Tensor:
    """One tensor of the checkpoint at the model's root (a Stanford ColBERT's projection beside its encoder)."""
    for filename in ("model.safetensors", "pytorch_model.bin"):
        with loading(source.name):
            path = cached_file(source.name, filename, **source.kwargs(), _raise_exceptions_for_missing_entries=False)
        if path is None:
            continue
        if filename.endswith(".safetensors"):
            with safe_open(path, framework="pt") as weights:
                if key in weights.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    tensor: torch.Tensor = weights.get_tensor(key)
                    return tensor
        elif key in (state := _read(path)):
            return state[key]
    raise ValueError(f"Model {source.name!r} is a Stanford ColBERT checkpoint without its {key!r}.")


def _read(path: str) -> dict[str, torch.Tensor]:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    return state
