"""The reference recipes ``scorekit check`` compares a served model with, written apart from the backends: they share
no code with the served path but the model's files (and an LLM reranker's template, which the check shows).

sentence-transformers computes a Sentence-Transformers folder's scores, as its users get them
(``CrossEncoder.predict``, ``SentenceTransformer.encode``, ``encode_query``/``encode_document`` and the cosine, a
SparseEncoder's dot product, a ColBERT's MaxSim by MultiVectorEncoder, which reads all three of its layouts); any
other folder a plain transformers forward, one input at a time, never padded: a classifier's logit and its sigmoid,
an encoder's mean-pooled tokens, an LLM reranker's prompt built by string formatting and its label logits at the
last token, jina-reranker-v3's published recipe, bge-m3's (FlagEmbedding's formulas, its heads read with
``torch.load``), a causal LM's next-token probabilities. Every recipe runs in
float32, on the asked device.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors import safe_open
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils.hub import cached_file

from scorekit.models import Backend, LLMRerankerBackend
from scorekit.models.files import Source, quiet_loading
from scorekit.models.rerank_template import RerankTemplate

# What a check of a Sentence-Transformers folder needs, and where to get it.
EXTRA = "sentence-transformers is needed to check a Sentence-Transformers model: pip install 'scorekit[check]'"
# Keys by which sentence-transformers (v4, v5, and before) marks config.json as a CrossEncoder's it saved.
_SAVED_BY_ST = ("sentence_transformers", "sbert_ce_default_activation_function")


@runtime_checkable
class PairRecipe(Protocol):
    """The scores of one query's documents."""

    def scores(self, query: str, documents: Sequence[str]) -> list[float]: ...


@runtime_checkable
class EmbeddingRecipe(PairRecipe, Protocol):
    """A bi-encoder's: the scores, and one text's embedding."""

    def embedding(self, text: str) -> list[float]: ...


@runtime_checkable
class LabelRecipe(Protocol):
    """A causal LM's: the next-token probability of each label after query + item (softmax over the labels)."""

    labels: dict[str, int]  # the label tokens the check asks for, by their text

    def probabilities(self, query: str, item: str) -> list[float]: ...


def recipe_for(backend: Backend, path: str, *, device: str, trust_remote_code: bool) -> PairRecipe | LabelRecipe:
    """The reference recipe for ``path`` served as ``backend`` (its kind, as detected or asked)."""
    model = _Model(path, torch.device(device), trust_remote_code)
    if backend.kind == "cross-encoder":
        return _STCrossEncoder(model) if _sentence_transformers(model, cross_encoder=True) else _Classifier(model)
    if backend.kind == "bi-encoder":
        return _STBiEncoder(model) if _sentence_transformers(model, cross_encoder=False) else _MeanPooled(model)
    if backend.kind == "sparse-encoder":
        return _STSparse(model)
    if backend.kind == "bge-m3":
        return _BGEM3(model)
    if backend.kind == "late-interaction":
        return _STMultiVector(model)
    if isinstance(backend, LLMRerankerBackend):
        return _LLMReranker(model, backend.template)
    if backend.kind == "listwise-reranker":
        return _Listwise(_Model(path, model.device, trust_remote_code=False))  # scorekit never runs its code either
    return _NextToken(model)


class _Model:
    """Where a recipe's files are, and how each is loaded: float32, on the device, in eval mode."""

    def __init__(self, path: str, device: torch.device, trust_remote_code: bool) -> None:
        self.path, self.device, self.trust_remote_code = path, device, trust_remote_code
        self.local_files_only = bool(Source(path).kwargs()["local_files_only"])

    def read_json(self, filename: str) -> Any:
        return Source(self.path).read_json(filename)

    def tokenizer(self) -> Any:
        return AutoTokenizer.from_pretrained(self.path, **self._kwargs())

    def load(self, auto_class: Any) -> Any:
        with quiet_loading():
            loaded = auto_class.from_pretrained(self.path, dtype=torch.float32, **self._kwargs())
        return loaded.to(self.device).eval()

    def st_kwargs(self) -> dict[str, Any]:
        return {"device": str(self.device), "model_kwargs": {"dtype": torch.float32}, **self._kwargs()}

    def _kwargs(self) -> dict[str, Any]:
        return {"trust_remote_code": self.trust_remote_code, "local_files_only": self.local_files_only}


def _sentence_transformers(model: _Model, *, cross_encoder: bool) -> bool:
    """Whether sentence-transformers saved the folder (a cross-encoder's config.json may be its only mark); a
    ValueError naming the extra when it is but sentence-transformers is not installed."""
    saved = model.read_json("config_sentence_transformers.json") is not None or model.read_json("modules.json")
    if cross_encoder and not saved:
        config = model.read_json("config.json")
        saved = isinstance(config, dict) and any(key in config for key in _SAVED_BY_ST)
    if saved and importlib.util.find_spec("sentence_transformers") is None:
        raise ValueError(EXTRA)
    return bool(saved)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class _STCrossEncoder:
    def __init__(self, model: _Model) -> None:
        from sentence_transformers import CrossEncoder

        with quiet_loading():
            self._model = CrossEncoder(model.path, **model.st_kwargs())

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        return [float(score) for score in self._model.predict([(query, document) for document in documents])]


class _Classifier:
    """A plain sequence classifier: the sigmoid of its one logit, what ``CrossEncoder.predict`` applies when
    nothing else was saved."""

    def __init__(self, model: _Model) -> None:
        self._tokenizer, self._model, self._device = (
            model.tokenizer(),
            model.load(AutoModelForSequenceClassification),
            model.device,
        )

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        found = []
        with torch.inference_mode():
            for document in documents:
                inputs = self._tokenizer(query, document, return_tensors="pt").to(self._device)
                logit = float(self._model(**inputs).logits[0, 0])
                found.append(1 / (1 + math.exp(-logit)))
        return found


class _STBiEncoder:
    def __init__(self, model: _Model) -> None:
        from sentence_transformers import SentenceTransformer

        with quiet_loading():
            self._model = SentenceTransformer(model.path, **model.st_kwargs())

    def embedding(self, text: str) -> list[float]:
        return [float(value) for value in self._model.encode([text], convert_to_tensor=True)[0].cpu()]

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """As its users rank: ``encode_query`` and ``encode_document`` (each side's saved prompt), the cosine."""
        query_embedding = self._model.encode_query([query], convert_to_tensor=True).double()
        embeddings = self._model.encode_document(list(documents), convert_to_tensor=True).double()
        return _cosines(embeddings, query_embedding[0])


class _STMultiVector:
    """A ColBERT, as sentence-transformers' MultiVectorEncoder ranks (it loads PyLate's and Stanford's layouts as
    well as its own): ``encode_query``, ``encode_document``, MaxSim."""

    def __init__(self, model: _Model) -> None:
        if importlib.util.find_spec("sentence_transformers") is None:
            raise ValueError(EXTRA)
        from sentence_transformers import MultiVectorEncoder

        with quiet_loading():
            self._model = MultiVectorEncoder(model.path, **model.st_kwargs())

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        queries = self._model.encode_query([query])
        similarity = self._model.similarity(queries, self._model.encode_document(list(documents)))
        return [float(value) for value in similarity[0].cpu()]


class _STSparse:
    """A SparseEncoder, as its users rank: ``encode_query``, ``encode_document`` and its similarity (the dot)."""

    def __init__(self, model: _Model) -> None:
        from sentence_transformers import SparseEncoder

        with quiet_loading():
            self._model = SparseEncoder(model.path, **model.st_kwargs())

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        queries = self._model.encode_query([query], convert_to_tensor=True)
        embeddings = self._model.encode_document(list(documents), convert_to_tensor=True)
        similarity = self._model.similarity(queries.to_dense(), embeddings.to_dense())  # dense: no beta warning
        return [float(value) for value in similarity[0].cpu()]


# The weights bge-m3's README passes to FlagEmbedding's compute_score: dense, sparse, ColBERT.
_M3_WEIGHTS = (0.4, 0.2, 0.4)


class _BGEM3:
    """bge-m3 as FlagEmbedding 1.4.2 computes it (``M3Embedder``, with ``EncoderOnlyEmbedderM3Model``'s heads), one
    text at a time: the dense vector, the [CLS] hidden state normalized; the lexical weights, per token id the largest
    relu(sparse_linear) above zero, the cls, eos, pad and unk ids left out; the ColBERT vectors, colbert_linear of
    every token after [CLS], each normalized. A pair's score is colbert+sparse+dense with the README's weights: (0.4
    dense + 0.2 lexical + 0.4 ColBERT) / 1.0, the ColBERT score the mean over the query's vectors of their best dot
    product with the document's."""

    def __init__(self, model: _Model) -> None:
        self._tokenizer, self._model, self._device = model.tokenizer(), model.load(AutoModel), model.device
        self._colbert, self._sparse = (_saved_linear(model, name) for name in ("colbert_linear.pt", "sparse_linear.pt"))
        names = ("cls_token", "eos_token", "pad_token", "unk_token")
        self._unused = {
            self._tokenizer.convert_tokens_to_ids(self._tokenizer.special_tokens_map[name]) for name in names
        }

    def _encode(self, text: str) -> tuple[torch.Tensor, dict[int, float], torch.Tensor]:
        with torch.inference_mode():
            inputs = self._tokenizer(text, return_tensors="pt").to(self._device)
            hidden = self._model(**inputs).last_hidden_state[0]
            weights = torch.relu(self._sparse(hidden)).squeeze(-1).tolist()
            colbert = torch.nn.functional.normalize(self._colbert(hidden[1:]), dim=-1)
        lexical: dict[int, float] = {}
        for token, weight in zip(inputs["input_ids"][0].tolist(), weights, strict=True):
            if token not in self._unused and weight > lexical.get(token, 0.0):
                lexical[token] = weight
        return torch.nn.functional.normalize(hidden[0], dim=-1), lexical, colbert

    def embedding(self, text: str) -> list[float]:
        return [float(value) for value in self._encode(text)[0].cpu()]

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        dense, lexical, colbert = self._encode(query)
        found = []
        for document in documents:
            their_dense, their_lexical, their_colbert = self._encode(document)
            sparse = sum(weight * their_lexical[token] for token, weight in lexical.items() if token in their_lexical)
            late = float((colbert @ their_colbert.T).max(dim=-1).values.sum()) / len(colbert)
            w_dense, w_sparse, w_colbert = _M3_WEIGHTS
            found.append(
                (w_dense * float(dense @ their_dense) + w_sparse * sparse + w_colbert * late) / sum(_M3_WEIGHTS)
            )
        return found


def _saved_linear(model: _Model, filename: str) -> torch.nn.Linear:
    """A Linear layer whose state ``torch.save`` left in one of the model's files."""
    path = cached_file(model.path, filename, local_files_only=model.local_files_only)
    if path is None:
        raise ValueError(f"Model {model.path!r} has no {filename}.")
    state = torch.load(path, map_location="cpu", weights_only=True)
    rows, columns = state["weight"].shape
    linear = torch.nn.Linear(columns, rows, bias="bias" in state)
    linear.load_state_dict(state)
    return linear.to(model.device).eval()


class _MeanPooled:
    """A plain encoder, as sentence-transformers makes one of a folder it did not save: its tokens' mean."""

    def __init__(self, model: _Model) -> None:
        self._tokenizer, self._model, self._device = model.tokenizer(), model.load(AutoModel), model.device

    def embedding(self, text: str) -> list[float]:
        with torch.inference_mode():
            inputs = self._tokenizer(text, return_tensors="pt").to(self._device)
            hidden = self._model(**inputs).last_hidden_state[0]
        return [float(value) for value in hidden.mean(dim=0).cpu()]

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        embeddings = torch.tensor([self.embedding(text) for text in (query, *documents)], dtype=torch.float64)
        return _cosines(embeddings[1:], embeddings[0])


def _cosines(rows: torch.Tensor, target: torch.Tensor) -> list[float]:
    return [float(value) for value in torch.nn.functional.cosine_similarity(rows, target[None, :])]


_SLOT = re.compile(r"\{(query|document|instruction)\}")


class _LLMReranker:
    """The template's segments filled by string formatting, each tokenized on its own and joined (as the published
    recipes do), BOS first when the template says so; the label logits at the last token: P(second label) by the
    softmax over two, the sigmoid of one."""

    def __init__(self, model: _Model, template: RerankTemplate) -> None:
        self._tokenizer, self._model, self._device = model.tokenizer(), model.load(AutoModelForCausalLM), model.device
        self._template = template
        self._labels = [self._label_id(label) for label in template.labels]

    def _label_id(self, label: str) -> int:
        found = self._tokenizer.convert_tokens_to_ids(label)
        if isinstance(found, int) and found != self._tokenizer.unk_token_id:
            return found
        [only] = _ids(self._tokenizer, label)
        return only

    def prompt(self, query: str, document: str) -> list[int]:
        template = self._template
        instruction = template.instruction_format.replace("{instruction}", template.instruction)
        values = {"query": query, "document": document, "instruction": instruction if template.instruction else ""}
        ids = [self._tokenizer.bos_token_id] if template.bos else []
        for segment in template.segments:
            ids += _ids(self._tokenizer, _SLOT.sub(lambda match: values[match.group(1)], segment))
        return ids

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        found = []
        with torch.inference_mode():
            for document in documents:
                ids = torch.tensor([self.prompt(query, document)], device=self._device)
                logits = self._model(input_ids=ids).logits[0, -1, self._labels].double()
                found.append(float(logits.softmax(dim=0)[-1]) if len(self._labels) == 2 else float(logits.sigmoid()[0]))
        return found


_EMBED, _RERANK = "<|embed_token|>", "<|rerank_token|>"
_LISTWISE_SYSTEM = (
    "<|im_start|>system\nYou are a search relevance expert who can determine a ranking of the passages based on how"
    " relevant they are to the query. If the query is a question, how relevant a passage is depends on how well it"
    " answers the question. If not, try to analyze the intent of the query and assess how well each passage"
    " satisfies the intent. If an instruction is provided, you should follow the instruction when determining the"
    " ranking.<|im_end|>\n<|im_start|>user\n"
)


class _Listwise:
    """jina-reranker-v3's published recipe: blocks of up to 64 documents, each block's prompt tokenized whole, the
    last hidden states at each document's marker and at the query's, the projector, and every document's cosine
    with the query embeddings averaged over the blocks, each weighted by its best (1 + cosine) / 2. The backbone
    is transformers' own (the checkpoint's code is not run); the projector is read from the weights."""

    def __init__(self, model: _Model) -> None:
        self._tokenizer, self._model, self._device = model.tokenizer(), model.load(AutoModel), model.device
        self._first, self._second = (_tensor(model, name) for name in ("projector.0.weight", "projector.2.weight"))
        self._markers = self._tokenizer.convert_tokens_to_ids([_EMBED, _RERANK])

    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        return (torch.relu(hidden @ self._first.T) @ self._second.T).double()

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        embedded, queries, weights = [], [], []
        with torch.inference_mode():
            for start in range(0, len(documents), 64):
                ids = self._tokenizer([_listwise_prompt(query, documents[start : start + 64])], return_tensors="pt")
                hidden = self._model(**ids.to(self._device)).last_hidden_state[0].float()
                row = ids["input_ids"][0]
                block = self._project(hidden[row == self._markers[0]])
                queries.append(self._project(hidden[row == self._markers[1]])[0])
                embedded.append(block)
                weights.append((1 + max(_cosines(block, queries[-1]))) / 2)
        merged = sum(weight * found for weight, found in zip(weights, queries, strict=True)) / sum(weights)
        return _cosines(torch.cat(embedded), torch.as_tensor(merged))


def _listwise_prompt(query: str, documents: Sequence[str]) -> str:
    passages = "".join(f'<passage id="{i}">\n{document}{_EMBED}\n</passage>\n' for i, document in enumerate(documents))
    return (
        f"{_LISTWISE_SYSTEM}I will provide you with {len(documents)} passages, each indicated by a numerical"
        f" identifier. Rank the passages based on their relevance to query: {query}\n{passages}<query>\n{query}"
        f"{_RERANK}\n</query><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def _tensor(model: _Model, key: str) -> torch.Tensor:
    """A tensor by name from the checkpoint's safetensors (one file, or the shard its index names)."""
    index = model.read_json("model.safetensors.index.json")
    filename = index["weight_map"][key] if isinstance(index, dict) else "model.safetensors"
    path = cached_file(model.path, filename, local_files_only=model.local_files_only)
    with safe_open(path, framework="pt") as weights:
        found: torch.Tensor = weights.get_tensor(key)
    return found.to(device=model.device, dtype=torch.float32)


class _NextToken:
    """A causal LM's next-token log-softmax after the query (with its special tokens) and the item (without), at
    the labels "yes" and "no" (the first token of each), renormalized over them: /generative_scoring's default."""

    def __init__(self, model: _Model) -> None:
        self._tokenizer, self._model, self._device = model.tokenizer(), model.load(AutoModelForCausalLM), model.device
        self.labels = {label: _ids(self._tokenizer, label)[0] for label in ("yes", "no")}

    def probabilities(self, query: str, item: str) -> list[float]:
        ids = list(self._tokenizer(query)["input_ids"]) + _ids(self._tokenizer, item)
        with torch.inference_mode():
            logits = self._model(input_ids=torch.tensor([ids], device=self._device)).logits[0, -1].float()
        picked = logits.log_softmax(dim=-1)[list(self.labels.values())].double()
        return [float(value) for value in picked.softmax(dim=0)]
