"""Tiny random models for tests: real transformers architectures and the MiniLM tokenizer, built offline.

They score nonsense, but every layer runs, and the fixed seed makes them the same on each build.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    BertPreTrainedModel,
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


# The tiny SPLADE's decoder bias: with it, a text's vector has a few hundred non-zero weights of its 30522, as a
# trained SPLADE's has (with none, half the vocabulary would pass the ReLU at some token). An inference-free one's
# documents have more (a few thousand), so that a query's few tokens meet some of them and its scores are not 0.
SPLADE_BIAS = -8.0
INFERENCE_FREE_BIAS = -5.0


def build_sparse_encoder(
    folder: Path, *, inference_free: bool = False, pooling: tuple[str, str] = ("max", "relu"), **saved: Any
) -> Path:
    """A SPLADE model saved by sentence-transformers' SparseEncoder: a two-layer BertForMaskedLM of width 32 (the
    MiniLM tokenizer's vocabulary) as its MLMTransformer, then SpladePooling(``pooling``: strategy, activation).
    ``inference_free``: a Router (``Router.for_query_document``) whose queries take a SparseStaticEmbedding of
    random weights and whose documents the masked-LM (a fill-mask Transformer) and the pooling. ``saved``:
    SparseEncoder's own arguments, saved in its config (prompts, default_prompt_name, max_active_dims)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import (
        MLMTransformer,
        Router,
        SparseStaticEmbedding,
        SpladePooling,
        Transformer,
    )

    torch.manual_seed(4)
    masked_lm = folder / "masked-lm"
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
    )
    model = BertForMaskedLM(config)
    with torch.no_grad():
        model.cls.predictions.bias.fill_(INFERENCE_FREE_BIAS if inference_free else SPLADE_BIAS)
    model.save_pretrained(masked_lm)
    _with_tokenizer(masked_lm)
    strategy, activation = pooling
    head = SpladePooling(pooling_strategy=strategy, activation_function=activation)  # type: ignore[arg-type]
    if inference_free:
        documents = Transformer(str(masked_lm), transformer_task="fill-mask")
        queries = SparseStaticEmbedding(documents.tokenizer, weight=torch.rand(config.vocab_size) * 2, frozen=True)
        modules: list[torch.nn.Module] = [Router.for_query_document([queries], [documents, head])]
    else:
        modules = [MLMTransformer(str(masked_lm)), head]
    SparseEncoder(modules=modules, **saved).save(str(folder / "sparse"))
    return folder / "sparse"


# The tiny ColBERTs' lengths: short enough that a few sentences overflow a document and a query fills its length.
COLBERT_QUERY_LENGTH = 12
COLBERT_DOCUMENT_LENGTH = 40


def _colbert_encoder(folder: Path, *, markers: Sequence[str] = ()) -> tuple[BertConfig, int]:
    """The two-layer BERT of width 32 every tiny ColBERT here holds, saved with the MiniLM tokenizer; ``markers``
    are added to the tokenizer first, as PyLate adds its [Q] and [D] (the embeddings grown to match). Returns its
    config and its vocabulary's size."""
    torch.manual_seed(5)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokenizer.add_tokens(list(markers))
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return config, len(tokenizer)


def build_pylate_colbert(folder: Path, *, dimensions: int = 16, **saved: Any) -> Path:
    """A ColBERT as PyLate saves it: a Sentence-Transformers folder (the Transformer, then PyLate's Dense to
    ``dimensions`` without bias), the [Q] and [D] markers added to its tokenizer, and PyLate's keys in
    config_sentence_transformers.json (``saved`` overrides them: query_length, attend_to_expansion_tokens...).
    Its sentence_bert_config.json keeps the max_seq_length PyLate's last encode left there (a query's, 11)."""
    from safetensors.torch import save_file

    _colbert_encoder(folder, markers=("[Q] ", "[D] "))
    dense = folder / "1_Dense"
    dense.mkdir()
    torch.manual_seed(6)
    linear = torch.nn.Linear(32, dimensions, bias=False)
    torch.nn.init.normal_(linear.weight, std=INIT_RANGE)
    save_file({"linear.weight": linear.weight.detach().contiguous()}, str(dense / "model.safetensors"))
    dense_config = {
        "in_features": 32,
        "out_features": dimensions,
        "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
        "use_residual": False,
    }
    (dense / "config.json").write_text(json.dumps(dense_config))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 11, "do_lower_case": False}))
    config = {
        "model_type": "ColBERT",
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": COLBERT_QUERY_LENGTH,
        "document_length": COLBERT_DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        "do_query_expansion": True,
        **saved,
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    return folder


class HF_ColBERT(BertPreTrainedModel):  # the class name a Stanford checkpoint's config.json names
    """What colbert-ai saves: a BERT under ``bert`` and the projection ``linear`` (no bias) beside it."""

    def __init__(self, config: BertConfig, dimensions: int = 16) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.linear = torch.nn.Linear(config.hidden_size, dimensions, bias=False)
        self.post_init()


def build_stanford_colbert(folder: Path, **metadata: Any) -> Path:
    """A Stanford ColBERT checkpoint (config.json's architectures: HF_ColBERT) with the MiniLM tokenizer, whose
    [unused0] and [unused1] are its markers, and artifact.metadata with the tiny lengths (``metadata`` overrides
    its fields; None drops one)."""
    config, _ = _colbert_encoder(folder)
    torch.manual_seed(7)
    HF_ColBERT(config).save_pretrained(folder)
    saved = {
        "query_token_id": "[unused0]",
        "doc_token_id": "[unused1]",
        "query_maxlen": COLBERT_QUERY_LENGTH,
        "doc_maxlen": COLBERT_DOCUMENT_LENGTH,
        "dim": 16,
        "similarity": "cosine",
        "attend_to_mask_tokens": False,
        "mask_punctuation": True,
        **metadata,
    }
    (folder / "artifact.metadata").write_text(json.dumps({k: v for k, v in saved.items() if v is not None}))
    return folder


def build_multi_vector(
    folder: Path, *, expansion: dict[str, Any] | None = None, tasks: Sequence[str] = ("document",), **saved: Any
) -> Path:
    """A late-interaction model saved by sentence-transformers' MultiVectorEncoder: the Transformer (the tiny
    lengths, and ``expansion`` as its query_expansion, "fixed" to the query length unless given), a Dense to 16
    dimensions on token embeddings, a MultiVectorMask skipping punctuation for ``tasks`` and a token-level
    Normalize; "[Q] " and "[D] " prompts registered as special tokens, as a converted PyLate checkpoint has them.
    ``saved``: MultiVectorEncoder's own arguments (similarity_fn_name, truncate_dim)."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import AddedToken

    encoder = folder / "encoder"
    _colbert_encoder(encoder)
    tokenizer = AutoTokenizer.from_pretrained(encoder)
    markers = [AddedToken(marker, normalized=False, special=True) for marker in ("[Q] ", "[D] ")]
    tokenizer.add_special_tokens({"additional_special_tokens": markers})  # type: ignore[dict-item]
    grown = BertModel.from_pretrained(encoder)
    grown.resize_token_embeddings(len(tokenizer))
    grown.save_pretrained(encoder)
    tokenizer.save_pretrained(encoder)
    asked = {"strategy": "fixed", "attend": False, "length": COLBERT_QUERY_LENGTH} if expansion is None else expansion
    transformer = Transformer(str(encoder), document_length=COLBERT_DOCUMENT_LENGTH, query_expansion=asked)
    torch.manual_seed(8)
    dense = Dense(32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
    torch.nn.init.normal_(dense.linear.weight, std=INIT_RANGE)
    modules = [
        transformer,
        dense,
        MultiVectorMask(skiplist_words=list(string.punctuation), skiplist_tasks=list(tasks)),
        Normalize(module_input_name="token_embeddings"),
    ]
    model = MultiVectorEncoder(modules=modules, prompts={"query": "[Q] ", "document": "[D] "}, device="cpu", **saved)
    model.save(str(folder / "multi-vector"))
    return folder / "multi-vector"


# The words the tiny XLM-RoBERTa tokenizers hold whole: the tests' sentences'.
_XLMR_CORPUS = (
    "What is the capital of France? The capital of France is Paris. The capital of Brazil is Brasilia. "
    "Bees make honey in their hives. Honey bees make sweet food in the summer. The river bank, the money in the "
    "bank; hello world. Wer schrieb den Faust? Goethe. The printing press, developed in Mainz around 1440 by "
    "Johannes Gutenberg, spread ideas. a b"
)


def build_xlmr_tokenizer(folder: Path, text: str = "", *, max_length: int = MAX_POSITIONS) -> Path:
    """A fast XLM-RoBERTa tokenizer as bge-m3's is (a SentencePiece Unigram over Metaspace pieces; <s>, <pad>,
    </s>, <unk> at ids 0 to 3 and <mask> last), its vocabulary written out (the hubs cannot be reached): each ASCII
    word of the sentences above and of ``text`` whole, after its "▁", then every ASCII letter, digit and punctuation
    mark alone, less likely, so a word it lacks is spelled out and only a non-ASCII letter is <unk> (which the tests
    want: its weight is left out of a sparse vector)."""
    from transformers import XLMRobertaTokenizer

    words = dict.fromkeys(re.findall(r"[A-Za-z0-9]+", f"{_XLMR_CORPUS} {text}"))
    pieces = [(token, 0.0) for token in ("<s>", "<pad>", "</s>", "<unk>")]
    pieces += [(f"\N{LOWER ONE EIGHTH BLOCK}{word}", -5.0) for word in words]
    pieces += [("\N{LOWER ONE EIGHTH BLOCK}", -6.0)]
    pieces += [(character, -8.0) for character in string.ascii_letters + string.digits + string.punctuation]
    XLMRobertaTokenizer(vocab=[*pieces, ("<mask>", 0.0)], model_max_length=max_length).save_pretrained(folder)
    return folder


def build_bge_m3(
    folder: Path,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    colbert_dimensions: int | None = None,
    text: str = "",
    init_range: float = INIT_RANGE,
) -> Path:
    """A bge-m3 as BAAI ships it: an XLMRobertaModel (two layers of width 32 unless asked; bench.bge_m3 builds a
    larger one), FlagEmbedding's heads beside its weights as ``torch.save`` leaves them (``colbert_linear.pt``: a
    Linear from the hidden size to ``colbert_dimensions``, the hidden size unless given; ``sparse_linear.pt``: a
    Linear to 1), and sentence-transformers' files for its dense output (modules.json: Transformer, Pooling cls,
    Normalize), all random from a fixed seed; its tokenizer from :func:`build_xlmr_tokenizer` (``text``: more words
    it holds whole)."""
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    build_xlmr_tokenizer(folder, text)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(9)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden if hidden < 64 else 4 * hidden,
        max_position_embeddings=MAX_POSITIONS + 2,  # XLM-R's positions start after the pad id's
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=init_range,
    )
    XLMRobertaModel(config).save_pretrained(folder)
    for name, width in (("colbert_linear", colbert_dimensions or hidden), ("sparse_linear", 1)):
        head = torch.nn.Linear(hidden, width)
        torch.nn.init.normal_(head.weight, std=init_range)
        torch.nn.init.normal_(head.bias, std=init_range)
        torch.save(head.state_dict(), folder / f"{name}.pt")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_POSITIONS}))
    return folder
