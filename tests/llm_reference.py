"""An independent reference for LLM rerankers: the published prompt strings, written out here (not taken from
scorekit), tokenized whole and run through a plain transformers forward, one prompt at a time.

Qwen3-Reranker's model card scores ``softmax([logit(no), logit(yes)])[1]`` after
``<system prefix><Instruct>: ...\\n<Query>: ...\\n<Document>: ...<assistant suffix>``; FlagEmbedding's
bge-reranker-v2-gemma scores ``logit(Yes)`` (sigmoid with ``normalize=True``) after
``<bos>A: {query}\\nB: {passage}\\n{prompt}``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
GEMMA_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'."
)


@dataclass
class Reference:
    """Scores of one tiny LLM reranker, computed the plain way."""

    preset: str  # "qwen3" or "gemma"
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel

    @classmethod
    def load(cls, folder: Path, preset: str) -> Reference:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        return cls(preset, tokenizer, model)

    def prompt(self, query: str, document: str, instruction: str | None = None) -> tuple[str, int]:
        """The exact prompt string, and where the document starts in it (characters)."""
        if self.preset == "qwen3":
            head = f"{QWEN3_PREFIX}<Instruct>: {instruction or QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: "
            return head + document + QWEN3_SUFFIX, len(head)
        head = f"A: {query}\nB: "
        return f"{head}{document}\n{instruction or GEMMA_PROMPT}", len(head)

    def ids(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        text, _ = self.prompt(query, document, instruction)
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [self.tokenizer.bos_token_id, *ids] if self.preset == "gemma" else ids

    def logit(self, ids: Sequence[int]) -> float:
        """The raw score of one prompt: logit(yes) - logit(no) (Qwen3), logit(Yes) (bge-gemma)."""
        with torch.inference_mode():
            logits = self.model(torch.tensor([list(ids)])).logits[0, -1].double()
        token = self.tokenizer.convert_tokens_to_ids
        if self.preset == "qwen3":
            return float(logits[token("yes")] - logits[token("no")])
        return float(logits[token("Yes")])

    def probability(self, ids: Sequence[int]) -> float:
        """The score with activation: Qwen3's P(yes) as its recipe computes it, bge's sigmoid(logit(Yes))."""
        if self.preset == "qwen3":
            with torch.inference_mode():
                logits = self.model(torch.tensor([list(ids)])).logits[0, -1]
            token = self.tokenizer.convert_tokens_to_ids
            pair = torch.stack([logits[token("no")], logits[token("yes")]])
            return float(torch.log_softmax(pair, dim=0)[1].exp())
        return 1 / (1 + math.exp(-self.logit(ids)))

    def score(self, query: str, document: str, instruction: str | None = None, *, raw: bool = False) -> float:
        ids = self.ids(query, document, instruction)
        return self.logit(ids) if raw else self.probability(ids)

    def cut(self, text: str, tokens: int) -> str:
        """``text`` cut after its first ``tokens`` tokens, at the character where the last kept one ends."""
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoding["offset_mapping"]
        return text if len(offsets) <= tokens else text[: offsets[tokens - 1][1]]

    def parts(self, query: str, document: str) -> tuple[list[int], list[int], list[int]]:
        """The prompt's tokens before the document, the document's, and after it: the document's are those
        of the whole prompt's tokenization whose characters overlap the document's."""
        text, start = self.prompt(query, document)
        end = start + len(document)
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        inside = [i for i, (low, high) in enumerate(offsets) if low < end and high > start]
        first, last = inside[0], inside[-1] + 1
        head = ([self.tokenizer.bos_token_id] if self.preset == "gemma" else []) + ids[:first]
        return head, ids[first:last], ids[last:]

    def windows(self, query: str, document: str, max_length: int, overlap: int) -> list[list[int]]:
        """The prompt with only a window of the document's tokens, each window as long as fits in
        ``max_length``, ``overlap`` tokens shared by neighbours."""
        head, doc, tail = self.parts(query, document)
        room = max_length - len(head) - len(tail)
        result, low = [], 0
        while True:
            result.append(head + doc[low : low + room] + tail)
            if low + room >= len(doc):
                return result
            low += room - overlap
