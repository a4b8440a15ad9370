"""Tiny random models for tests: real transformers architectures and the MiniLM tokenizer, built offline.

They score nonsense, but every layer runs, and the fixed seed makes them the same on each build.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

from scorekit.models import default_model_path

# 128 positions keeps over-long inputs (and so truncation tests) cheap; the tokenizer says 512.
MAX_POSITIONS = 128
# A wide initialisation makes scores differ between inputs: with the default 0.02 every pair scores about 0.5,
# and a comparison to 1e-5 would prove nothing.
INIT_RANGE = 0.5


def build_cross_encoder(folder: Path) -> Path:
    """A single-label BERT sequence classifier (what sentence-transformers' CrossEncoder loads)."""
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
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
