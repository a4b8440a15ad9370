"""bge-m3's recipe as FlagEmbedding 1.4.2 publishes it, written out for the tests (FlagEmbedding is not installed: its
source was read, ``FlagEmbedding/inference/embedder/encoder_only/m3.py`` and
``FlagEmbedding/finetune/embedder/encoder_only/m3/modeling.py``). It shares no code with scorekit: transformers'
``AutoModel``, the two heads loaded with ``torch.load``, and the formulas below.

``encode`` is ``M3Embedder.encode_single_device`` (the texts of one call in one padded batch, as it runs them):
dense, the [CLS] hidden state normalized; lexical weights, per token id the largest relu(sparse_linear) weight above
zero, the cls, eos, pad and unk ids left out (``_process_token_weights``); ColBERT vectors, colbert_linear of every
token after [CLS], masked, normalized, the first ``tokens - 1`` kept (``_process_colbert_vecs``). ``compute_score`` is
``compute_score_single_device`` with each pair's ColBERT score by ``colbert_score`` (one query, one document).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.nn import functional
from transformers import AutoModel, AutoTokenizer

# The weights bge-m3's README passes to compute_score: dense, sparse, ColBERT.
WEIGHTS = (0.4, 0.2, 0.4)
MODES = ("dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense")


class M3Reference:
    def __init__(self, folder: Path) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).eval()
        self.colbert_linear = _head(folder / "colbert_linear.pt")
        self.sparse_linear = _head(folder / "sparse_linear.pt")
        names = ("cls_token", "eos_token", "pad_token", "unk_token")
        self.unused = {self.tokenizer.convert_tokens_to_ids(self.tokenizer.special_tokens_map[name]) for name in names}

    def encode(self, texts: list[str], max_length: int | None = None) -> dict[str, Any]:
        with torch.inference_mode():
            inputs = self.tokenizer(
                texts, padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
            )
            mask = inputs["attention_mask"]
            hidden = self.model(**inputs).last_hidden_state
            dense = functional.normalize(hidden[:, 0], dim=-1)
            token_weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1)
            lexical = []
            for weights, ids in zip(token_weights.tolist(), inputs["input_ids"].tolist(), strict=True):
                result: dict[int, float] = {}
                for weight, token in zip(weights, ids, strict=True):
                    if token not in self.unused and weight > 0 and weight > result.get(token, 0):
                        result[token] = weight
                lexical.append(result)
            colbert = self.colbert_linear(hidden[:, 1:]) * mask[:, 1:][:, :, None].float()
            colbert = functional.normalize(colbert, dim=-1)
            vectors = [found[: int(count) - 1] for found, count in zip(colbert, mask.sum(dim=1), strict=True)]
        return {"dense_vecs": dense, "lexical_weights": lexical, "colbert_vecs": vectors}

    @staticmethod
    def lexical_score(first: dict[int, float], second: dict[int, float]) -> float:
        return sum(weight * second[token] for token, weight in first.items() if token in second)

    @staticmethod
    def colbert_score(query: torch.Tensor, passage: torch.Tensor) -> float:
        return float((query @ passage.T).max(-1).values.sum() / query.shape[0])

    def compute_score(
        self, pairs: list[tuple[str, str]], weights: tuple[float, float, float] = WEIGHTS
    ) -> dict[str, list[float]]:
        queries = self.encode([query for query, _ in pairs])
        passages = self.encode([passage for _, passage in pairs])
        dense = (queries["dense_vecs"] * passages["dense_vecs"]).sum(dim=-1).tolist()
        sparse = [
            self.lexical_score(query, passage)
            for query, passage in zip(queries["lexical_weights"], passages["lexical_weights"], strict=True)
        ]
        colbert = [
            self.colbert_score(query, passage)
            for query, passage in zip(queries["colbert_vecs"], passages["colbert_vecs"], strict=True)
        ]
        w_dense, w_sparse, w_colbert = weights
        return {
            "dense": dense,
            "sparse": sparse,
            "colbert": colbert,
            "sparse+dense": [
                (s * w_sparse + d * w_dense) / (w_sparse + w_dense) for d, s in zip(dense, sparse, strict=True)
            ],
            "colbert+sparse+dense": [
                (c * w_colbert + s * w_sparse + d * w_dense) / sum(weights)
                for d, s, c in zip(dense, sparse, colbert, strict=True)
            ],
        }


def _head(path: Path) -> torch.nn.Linear:
    state = torch.load(path, map_location="cpu", weights_only=True)
    rows, columns = state["weight"].shape
    head = torch.nn.Linear(columns, rows)
    head.load_state_dict(state)
    return head.eval()
