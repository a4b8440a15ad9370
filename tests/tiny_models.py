"""Tiny random models for tests: real transformers architectures and the MiniLM tokenizer, built offline.

They score nonsense, but every layer runs, and the fixed seed makes them the same on each build.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GemmaConfig,
    GemmaForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from scorekit.models import default_model_path

# 128 positions keeps over-long inputs (and so truncation tests) cheap; the tokenizer says 512.
MAX_POSITIONS = 128
# A wide initialisation makes scores differ between inputs: with the default 0.02 every pair scores about 0.5,
# and a comparison to 1e-5 would prove nothing.
INIT_RANGE = 0.5


def build_cross_encoder(folder: Path, *, layers: int = 2) -> Path:
    """A single-label BERT sequence classifier (what sentence-transformers' CrossEncoder loads), of width 32 and
    two layers unless asked (bench.model_host builds a one-layer one)."""
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
    )
    config.num_labels = 1
    BertForSequenceClassification(config).save_pretrained(folder)
    return _with_tokenizer(folder)


def build_causal_lm(folder: Path) -> Path:
    """A two-layer Llama whose vocabulary is the MiniLM tokenizer's (30522 ids)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        initializer_range=INIT_RANGE,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return _with_tokenizer(folder)


def _with_tokenizer(folder: Path) -> Path:
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


# What the byte-level BPE tokenizer of the tiny LLM rerankers learns its merges from: the reranker prompts'
# words and the label tokens, so "yes", "no", "Yes" and "No" are single tokens as in Qwen's and Gemma's.
_BPE_CORPUS = [
    "yes no Yes No",
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided.",
    "Given a web search query, retrieve relevant passages that answer the query",
    "Given a query A and a passage B, determine whether the passage contains an answer to the query",
    "What is the capital of France? The capital of France is Paris. The capital of Brazil is Brasilia.",
    "document number talks about topic in some detail",
]
_SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Long enough for a pair with a short document, short enough that a few sentences overflow it.
RERANKER_MAX_POSITIONS = 256


def build_bpe_tokenizer(
    folder: Path,
    corpus: Sequence[str] = (),
    max_length: int = RERANKER_MAX_POSITIONS,
    vocab_size: int = 600,
    specials: Sequence[str] = (),
) -> Path:
    """A byte-level BPE tokenizer as Qwen's and Gemma's are (special tokens atomic, words with their leading
    space), trained here on the prompts' sentences and ``corpus``: a few hundred ids; ``specials`` are more
    atomic tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*_SPECIAL_TOKENS, *specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    labels = ["yes", "no", "Yes", "No"] * 20  # a label must be one token, as it is in the real vocabularies
    tokenizer.train_from_iterator([*_BPE_CORPUS, *labels, *corpus], trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        model_max_length=max_length,
    ).save_pretrained(folder)
    return folder


def build_qwen3_reranker(
    folder: Path,
    *,
    hidden_size: int = 32,
    layers: int = 2,
    corpus: Sequence[str] = (),
    max_length: int = RERANKER_MAX_POSITIONS,
    vocab_size: int = 600,
) -> Path:
    """A Qwen3 causal LM (model_type qwen3: the Qwen3-Reranker preset) with the BPE tokenizer, trained also on
    ``corpus``; heads of 16 dimensions. Two layers of width 32 unless asked (the benchmark builds a bigger one)."""
    torch.manual_seed(0)
    vocab = len(AutoTokenizer.from_pretrained(build_bpe_tokenizer(folder, corpus, max_length, vocab_size)))
    heads = hidden_size // 16
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        head_dim=16,
        max_position_embeddings=max_length,
        pad_token_id=0,
        initializer_range=INIT_RANGE,
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def _two_layers(vocab: int, positions: int) -> dict[str, int | float]:
    """The shape every tiny two-layer LLM reranker here shares: width 32, two heads, one key/value head."""
    return {
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": positions,
        "pad_token_id": 0,
        "initializer_range": INIT_RANGE,
    }


def build_mxbai_reranker(folder: Path) -> Path:
    """A two-layer Qwen2 causal LM, as mxbai-rerank-v2 is (model_type qwen2: its preset comes from its name, so
    give ``folder`` one with "mxbai-rerank" in it), with the BPE tokenizer, where "0" and "1" are tokens; 1024
    positions, as its task prompt alone is some 200 of this small vocabulary's tokens."""
    torch.manual_seed(2)
    vocab = len(AutoTokenizer.from_pretrained(build_bpe_tokenizer(folder, max_length=1024)))
    Qwen2ForCausalLM(Qwen2Config(**_two_layers(vocab, 1024))).save_pretrained(folder)
    return folder


def build_gemma_reranker(folder: Path) -> Path:
    """A two-layer Gemma causal LM (model_type gemma: the bge-reranker-v2-gemma preset), BPE tokenizer."""
    torch.manual_seed(1)
    vocab = len(AutoTokenizer.from_pretrained(build_bpe_tokenizer(folder)))
    config = GemmaConfig(**_two_layers(vocab, RERANKER_MAX_POSITIONS), head_dim=16, bos_token_id=1, eos_token_id=2)
    GemmaForCausalLM(config).save_pretrained(folder)
    return folder


class JinaForRanking(Qwen3ForCausalLM):
    """What a jina-reranker-v3 checkpoint holds, as its published class saves it: a Qwen3 causal LM whose LM head
    is the identity, and a projector (two bias-free linear layers around a ReLU, to 512 dimensions). Only the
    structure: the tests write the recipe's forward themselves."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        self.lm_head = torch.nn.Identity()  # type: ignore[assignment]
        self.projector = torch.nn.Sequential(
            torch.nn.Linear(config.hidden_size, config.hidden_size // 2, bias=False),
            torch.nn.ReLU(),
            torch.nn.Linear(config.hidden_size // 2, 512, bias=False),
        )
        self.post_init()


JINA_MARKERS = ("<|embed_token|>", "<|rerank_token|>")


def build_jina_reranker(folder: Path, *, max_length: int = 1024) -> Path:
    """A two-layer jina-reranker-v3 (config.json's architectures: JinaForRanking; its auto_map names the
    checkpoint's own code, which is not in the folder, as scorekit never runs it), with the BPE tokenizer, where
    both markers are atomic tokens; ``max_length`` positions."""
    torch.manual_seed(3)
    corpus = ["I will provide you with passages, each indicated by a numerical identifier. Rank the passages"]
    tokenizer = build_bpe_tokenizer(folder, corpus, max_length, specials=JINA_MARKERS)
    config = Qwen3Config(**_two_layers(len(AutoTokenizer.from_pretrained(tokenizer)), max_length), head_dim=16)
    config.auto_map = {"AutoModel": "modeling.JinaForRanking"}
    JinaForRanking(config).save_pretrained(folder)
    return folder
