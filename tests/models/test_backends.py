"""The backends against the reference libraries: sentence-transformers for the encoders, plain transformers for
the causal LM, the tokenizer's own truncation for ours."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from packaging.version import Version
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoModelForCausalLM, AutoTokenizer, BertConfig, BertForSequenceClassification

from scorekit.models import (
    Backend,
    BiEncoderBackend,
    CausalLMBackend,
    CrossEncoderBackend,
    Encoded,
    InputTooLong,
    TruncationTooLarge,
    default_model_path,
    detect_kind,
    load_backend,
    tokens,
)
from scorekit.models import causal_lm as causal_lm_module
from scorekit.models.base import no_checkpoint
from scorekit.tasks import EmbedOptions, PairOptions
from tests.tiny_models import MAX_POSITIONS, build_causal_lm, build_cross_encoder

CLS, SEP = 101, 102
LONG = "the quick brown fox jumps over the lazy dog " * 40  # about 360 tokens: over every model's limit
PAIRS = [
    ("what is the capital of france", "paris is the capital and largest city of france"),
    ("a", "b c d e f g h i j k l m n o p"),
    ("how do bees make honey from the nectar of flowers they visit", "bees"),
    ("", "an empty query still has its special tokens"),
]


@pytest.fixture(scope="module")
def minilm() -> BiEncoderBackend:
    backend = load_backend(default_model_path())
    assert isinstance(backend, BiEncoderBackend)
    return backend


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_dir: Path) -> CrossEncoderBackend:
    backend = load_backend(str(cross_encoder_dir))
    assert isinstance(backend, CrossEncoderBackend)
    return backend


@pytest.fixture(scope="module")
def causal_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_causal_lm(tmp_path_factory.mktemp("causal-lm"))


@pytest.fixture(scope="module")
def causal_lm(causal_lm_dir: Path) -> CausalLMBackend:
    backend = load_backend(str(causal_lm_dir))
    assert isinstance(backend, CausalLMBackend)
    return backend


# Scores against the reference libraries


def test_bi_encoder_matches_sentence_transformers(minilm: BiEncoderBackend) -> None:
    queries = [query for query, _ in PAIRS]
    documents = [document for _, document in PAIRS]
    ours = _embed(minilm, queries + documents, EmbedOptions())
    reference = SentenceTransformer(default_model_path(), device="cpu")
    expected = torch.from_numpy(reference.encode(queries + documents))
    assert minilm.pooling == "mean"
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    n = len(PAIRS)
    cosines = (ours[:n] * ours[n:]).sum(dim=1)
    expected_cosines = torch.nn.functional.cosine_similarity(expected[:n], expected[n:])
    torch.testing.assert_close(cosines, expected_cosines, rtol=0, atol=1e-5)


def test_bi_encoder_one_query_scores_equal_the_zipped_pairs_bit_for_bit(minilm: BiEncoderBackend) -> None:
    """1:N multiplies every embedding by the query's in place; N:N multiplies the rows it picks: the same
    floats, from the same forward, and the cosines of the embeddings."""
    query, documents = PAIRS[0][0], [document for _, document in PAIRS]

    def scores(side1: list[str]) -> list[float]:
        encoding = minilm.plan_pairs(side1, documents, PairOptions()).encode(no_checkpoint)
        return encoding.finish(minilm.forward(encoding.inputs)).scores

    one_query = scores([query])
    assert one_query == scores([query] * len(documents))
    embeddings = _embed(minilm, [query, *documents], EmbedOptions(normalize=True))
    torch.testing.assert_close(torch.tensor(one_query), embeddings[1:] @ embeddings[0], rtol=0, atol=1e-6)


def test_cross_encoder_matches_cross_encoder_predict(
    cross_encoder: CrossEncoderBackend, cross_encoder_dir: Path
) -> None:
    queries = [query for query, _ in PAIRS]
    documents = [document for _, document in PAIRS]
    logits = cross_encoder.forward(cross_encoder.encode_pairs(queries, documents, None, None))
    assert all(logit.shape == () and logit.dtype == torch.float32 for logit in logits)
    reference = CrossEncoder(str(cross_encoder_dir), device="cpu")
    assert isinstance(reference.activation_fn, torch.nn.Sigmoid)  # CrossEncoder's default for one label
    expected = torch.from_numpy(reference.predict(PAIRS)).double()
    ours = torch.tensor([cross_encoder.activation(float(logit)) for logit in logits], dtype=torch.float64)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    assert ours.max() - ours.min() > 0.05  # the tiny model tells the pairs apart


def test_cross_encoder_keeps_a_saved_identity_activation(cross_encoder_dir: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(cross_encoder_dir, tmp_path / "identity")
    config = json.loads((folder / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    (folder / "config.json").write_text(json.dumps(config))
    backend = load_backend(str(folder))
    assert isinstance(backend, CrossEncoderBackend)
    logit = float(backend.forward(backend.encode_pairs(["q"], ["d"], None, None))[0])
    assert backend.activation(logit) == logit
    expected = float(CrossEncoder(str(folder), device="cpu").predict([("q", "d")])[0])
    assert abs(logit - expected) < 1e-5


def test_cross_encoder_needs_one_label(tmp_path: Path) -> None:
    # A complete two-label classifier (NLI-style): every weight is trained, but there is no single relevance logit.
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="has 2 labels; a cross-encoder needs exactly one"):
        load_backend(str(tmp_path), kind="cross-encoder")


def test_a_causal_lm_needs_a_transformers_with_per_row_logits(
    causal_lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before transformers 5.21, the model read a (batch, 1) logits_to_keep as every row's position in every row, and
    the first batch failed: the load says so instead (seen on a machine with transformers 5.17)."""
    monkeypatch.setattr(causal_lm_module, "TRANSFORMERS", Version("5.17.0"))
    with pytest.raises(ValueError, match=r"needs transformers 5\.21 or later .*; this is transformers 5\.17\.0"):
        load_backend(str(causal_lm_dir))


@pytest.mark.parametrize("item_first", [False, True])
def test_causal_lm_matches_single_sequence_log_softmax(
    causal_lm: CausalLMBackend, causal_lm_dir: Path, item_first: bool
) -> None:
    query = "is the following review positive?"
    items: list[str | list[int]] = ["yes", "no, this was a terrible and far too long film", [2023, 2001, 2204]]
    labels = [2748, 2053, 0]
    outputs = causal_lm.forward(
        causal_lm.encode_prompts(query, items, labels, item_first=item_first, add_special_tokens=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(causal_lm_dir)
    model = AutoModelForCausalLM.from_pretrained(causal_lm_dir, dtype=torch.float32)  # in eval mode
    query_ids = tokenizer(query)["input_ids"]
    assert query_ids[0] == CLS  # add_special_tokens reached the query
    for item, output in zip(items, outputs, strict=True):
        item_ids = item if isinstance(item, list) else tokenizer(item, add_special_tokens=False)["input_ids"]
        prompt = item_ids + query_ids if item_first else query_ids + item_ids
        with torch.inference_mode():
            logits = model(torch.tensor([prompt])).logits[0, -1]
        expected = logits.log_softmax(-1)[labels]
        assert output.dtype == torch.float32 and output.shape == (len(labels),)
        torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)


def test_a_forward_builds_no_autograd_graph_whoever_calls_it(
    minilm: BiEncoderBackend, cross_encoder: CrossEncoderBackend, causal_lm: CausalLMBackend
) -> None:
    """A backend's forward enters inference mode itself (``base.inference``, the one place): a caller outside
    the worker (the token-budget probe, a test, a benchmark) gets outputs with no autograd graph behind them."""
    assert not torch.is_inference_mode_enabled()
    batches: list[tuple[Backend, list[Encoded]]] = [
        (minilm, minilm.encode_texts(["a text"], None, None)),
        (cross_encoder, cross_encoder.encode_pairs(["q"], ["d"], None, None)),
        (causal_lm, causal_lm.encode_prompts("q", ["an item"], [1], item_first=False, add_special_tokens=True)),
    ]
    for backend, batch in batches:
        outputs = backend.forward(batch)
        assert outputs and all(torch.is_inference(output) and not output.requires_grad for output in outputs)
    assert not torch.is_inference_mode_enabled()


def test_causal_lm_token_ids_and_no_special_tokens(causal_lm: CausalLMBackend) -> None:
    [prompt] = causal_lm.encode_prompts([7, 8], ["hello"], [1], item_first=False, add_special_tokens=True)
    assert prompt.input_ids.tolist() == [7, 8, 7592]  # a token-id query is used as it is
    [prompt] = causal_lm.encode_prompts("hello", [[9]], [1], item_first=True, add_special_tokens=False)
    assert prompt.input_ids.tolist() == [9, 7592]
    assert prompt.label_token_ids == (1,)


def test_causal_lm_keeps_the_first_max_length_minus_one_tokens(causal_lm: CausalLMBackend) -> None:
    [prompt] = causal_lm.encode_prompts("q", [LONG], [1], item_first=False, add_special_tokens=True)
    assert prompt.cost == causal_lm.max_length - 1 == MAX_POSITIONS - 1
    assert prompt.input_ids[:4].tolist() == [CLS, 1053, SEP, 1996]  # [CLS] q [SEP] the ...
    assert len(causal_lm.forward([prompt])[0]) == 1


@pytest.mark.parametrize("item_first", [False, True])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_causal_lm_reads_a_long_query_only_as_deep_as_a_prompt_keeps(
    causal_lm: CausalLMBackend, monkeypatch: pytest.MonkeyPatch, item_first: bool, add_special_tokens: bool
) -> None:
    """The prompts of a ~400 KB query and item equal those built from the whole texts (every text counted as
    short), with a small part of the work."""
    query, item = LONG * 200, "an item " * 20_000

    def prompts() -> tuple[list[Encoded], int]:
        work = 0

        def count(units: int) -> None:
            nonlocal work
            work += units

        encoded = causal_lm.encode_prompts(
            query, [item, "short"], [1], item_first=item_first, add_special_tokens=add_special_tokens, checkpoint=count
        )
        return encoded, work

    read, work = prompts()
    monkeypatch.setattr(tokens, "PIECE_CHARS", 10**9)
    whole, whole_work = prompts()
    assert read == whole and all(prompt.truncated for prompt in read)
    assert work * 10 < whole_work


def test_causal_lm_label_checks(causal_lm: CausalLMBackend) -> None:
    with pytest.raises(ValueError, match=r"^label_token_ids must contain at least one token ID\.$"):
        causal_lm.check_labels([])
    for bad in (30522, -1):
        message = f"label_token_id {bad} is out of vocabulary range [0, 30522). Please provide valid token IDs."
        with pytest.raises(ValueError) as caught:
            causal_lm.check_labels([5, bad])
        assert str(caught.value) == message
    causal_lm.check_labels([0, 30521])
    with pytest.raises(ValueError, match="out of vocabulary"):
        causal_lm.encode_prompts([30522], ["x"], [1], item_first=False, add_special_tokens=True)


def test_batched_forward_equals_unbatched(
    minilm: BiEncoderBackend, cross_encoder: CrossEncoderBackend, causal_lm: CausalLMBackend
) -> None:
    texts = ["short", "a somewhat longer text than the first one", LONG[:200]]
    batches: list[tuple[Backend, list[Encoded]]] = [
        (minilm, minilm.encode_texts(texts, None, None)),
        (cross_encoder, cross_encoder.encode_pairs(texts, texts[1:] + texts[:1], None, None)),
        (causal_lm, causal_lm.encode_prompts("q", texts, [1, 2], item_first=False, add_special_tokens=True)),
    ]
    for backend, batch in batches:
        assert len({item.cost for item in batch}) == len(batch)  # padding is exercised
        batched = backend.forward(batch)
        for item, output in zip(batch, batched, strict=True):
            torch.testing.assert_close(output, backend.forward([item])[0], rtol=0, atol=1e-5)
        assert backend.forward([]) == []


# Truncation


def test_too_long_without_truncation_names_the_index(
    minilm: BiEncoderBackend, cross_encoder: CrossEncoderBackend
) -> None:
    with pytest.raises(InputTooLong) as caught:
        minilm.encode_texts(["short", "short", LONG], None, None)
    assert (caught.value.index, caught.value.maximum) == (2, 256)
    assert caught.value.length > 256
    with pytest.raises(InputTooLong) as caught:
        cross_encoder.encode_pairs(["q", "q"], ["d", LONG], None, "left")
    assert (caught.value.index, caught.value.maximum) == (1, MAX_POSITIONS)


def test_an_input_past_the_first_tokenizing_chunk_is_named_by_its_own_index(
    minilm: BiEncoderBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Texts are fitted one tokenizing chunk at a time (each chunk's encodings freed before the next)."""
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 12)
    texts = ["short one", "short two", "short six", LONG, "short"]
    with pytest.raises(InputTooLong) as caught:
        minilm.encode_texts(texts, None, None)
    assert caught.value.index == 3
    chunked = minilm.encode_texts(texts, -1, None)
    monkeypatch.undo()
    assert chunked == minilm.encode_texts(texts, -1, None)


def test_minus_one_truncates_to_the_maximum(minilm: BiEncoderBackend, cross_encoder: CrossEncoderBackend) -> None:
    [text] = minilm.encode_texts([LONG], -1, None)
    assert text.cost == minilm.max_length == 256
    short, long = cross_encoder.encode_pairs(["q", LONG], ["d", LONG], -1, None)
    assert (short.cost, long.cost) == (5, MAX_POSITIONS)


@pytest.mark.parametrize("side", ["right", "left"])
def test_single_text_keeps_the_chosen_end_and_special_tokens(minilm: BiEncoderBackend, side: str) -> None:
    full = minilm.encode_texts([LONG[:120]], None, None)[0].input_ids.tolist()
    [cut] = minilm.encode_texts([LONG[:120]], 8, "right" if side == "right" else "left")
    content = full[1:7] if side == "right" else full[-7:-1]
    assert cut.input_ids.tolist() == [CLS, *content, SEP]
    assert cut.token_type_ids is not None and cut.token_type_ids.tolist() == [0] * 8


def test_side_none_is_the_tokenizers_side(minilm: BiEncoderBackend) -> None:
    assert minilm.encode_texts([LONG], 10, None) == minilm.encode_texts([LONG], 10, "right")
    assert minilm.encode_texts([LONG], 10, None) != minilm.encode_texts([LONG], 10, "left")


def test_pair_truncation_equals_the_tokenizers_longest_first(
    cross_encoder: CrossEncoderBackend, cross_encoder_dir: Path
) -> None:
    reference = AutoTokenizer.from_pretrained(cross_encoder_dir)
    words = LONG.split()
    texts = [" ".join(words[:n]) for n in (0, 1, 3, 4, 9, 30)]
    pairs = [(first, second) for first in texts for second in texts]
    for side in ("right", "left"):
        reference.truncation_side = side
        for limit in (3, 4, 10, 11, 25):
            firsts, seconds = [a for a, _ in pairs], [b for _, b in pairs]
            ours = cross_encoder.encode_pairs(firsts, seconds, limit, side)
            # Lists, as CrossEncoder passes them (a single call drops an empty second text).
            expected = reference(firsts, seconds, truncation="longest_first", max_length=limit)
            for row, encoded in enumerate(ours):
                assert encoded.input_ids.tolist() == expected["input_ids"][row], (side, limit, pairs[row])
                assert encoded.token_type_ids is not None
                assert encoded.token_type_ids.tolist() == expected["token_type_ids"][row]
                assert encoded.input_ids[0] == CLS and encoded.input_ids.count(SEP) == 2


def test_truncation_beyond_the_maximum_is_an_error(
    minilm: BiEncoderBackend, cross_encoder: CrossEncoderBackend
) -> None:
    message = "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size."
    with pytest.raises(TruncationTooLarge, match=message):
        minilm.encode_texts(["short"], 257, None)
    with pytest.raises(TruncationTooLarge, match=message):
        cross_encoder.encode_pairs(["q"], ["d"], MAX_POSITIONS + 1, None)
    assert cross_encoder.encode_pairs(["q"], ["d"], MAX_POSITIONS, None)[0].cost == 5


def test_truncation_below_the_special_tokens_is_an_error(cross_encoder: CrossEncoderBackend) -> None:
    with pytest.raises(ValueError, match="at least 3"):
        cross_encoder.encode_pairs(["query"], ["document"], 2, None)
    with pytest.raises(ValueError, match="-1 or a positive number"):
        cross_encoder.encode_pairs(["query"], ["document"], 0, None)


def test_tokenizing_from_many_threads_with_different_truncations(cross_encoder: CrossEncoderBackend) -> None:
    # Tokenizing runs on any worker thread: no shared setting (a fast tokenizer's truncation state, its
    # truncation_side) may leak from one request into another, nor raise "Already borrowed".
    jobs = [(limit, side) for limit in (None, -1, 6, 20, 64) for side in ("left", "right")] * 20

    def encode(job: tuple[int | None, str]) -> list[Encoded]:
        limit, side = job
        return cross_encoder.encode_pairs(
            [LONG[:300]] * 4, ["d " * 50] * 4, limit, "left" if side == "left" else "right"
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(encode, jobs))
    assert results == [encode(job) for job in jobs]


def test_pairs_need_equal_lengths(cross_encoder: CrossEncoderBackend) -> None:
    with pytest.raises(ValueError, match="2 queries but 1 documents"):
        cross_encoder.encode_pairs(["a", "b"], ["c"], None, None)


# Detection and loading


def test_detect_kind(cross_encoder_dir: Path, causal_lm_dir: Path) -> None:
    assert detect_kind(default_model_path()) == "bi-encoder"
    assert detect_kind(str(cross_encoder_dir)) == "cross-encoder"
    assert detect_kind(str(causal_lm_dir)) == "causal-lm"


def test_loading_errors_are_clear(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="could not be loaded"):
        detect_kind(str(empty))
    with pytest.raises(ValueError, match=r"^Model '.*empty' could not be loaded \(\w+\)\. Give a local"):
        load_backend(str(empty), kind="bi-encoder")
    with pytest.raises(ValueError, match="Unsupported device 'tpu'"):
        load_backend(default_model_path(), device="tpu")
    with pytest.raises(ValueError, match="Unsupported dtype 'int8'"):
        load_backend(default_model_path(), dtype="int8")


def _embed(backend: BiEncoderBackend, texts: list[str], options: EmbedOptions) -> torch.Tensor:
    encoding = backend.plan_embed(texts, options).encode(no_checkpoint)
    return torch.tensor(encoding.finish(backend.forward(encoding.inputs)).vectors)


def test_a_bi_encoder_without_normalize_embeds_as_sentence_transformers_does(tmp_path: Path) -> None:
    """MiniLM's weights with mean_sqrt_len_tokens pooling and no Normalize module: sentence-transformers
    answers unnormalized vectors, and so does the default embedding; a cosine still normalizes."""
    folder = shutil.copytree(default_model_path(), tmp_path / "sqrt-len")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([m for m in modules if not m["type"].endswith("Normalize")]))
    pooling_config = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling_config.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_mean_sqrt_len_tokens=True)
    pooling_config.write_text(json.dumps(config))
    backend = load_backend(str(folder))
    assert isinstance(backend, BiEncoderBackend) and not backend.normalizes
    texts = [text for pair in PAIRS for text in pair]
    expected = torch.from_numpy(SentenceTransformer(str(folder), device="cpu").encode(texts))
    assert expected.norm(dim=1).min() > 1.5, "the reference is unit length: this test would be blind"
    torch.testing.assert_close(_embed(backend, texts, EmbedOptions()), expected, rtol=0, atol=1e-5)
    normalized = torch.nn.functional.normalize(expected, dim=1)
    torch.testing.assert_close(_embed(backend, texts, EmbedOptions(normalize=True)), normalized, rtol=0, atol=1e-5)
    pairs = backend.plan_pairs([texts[0]], texts[1:2], PairOptions()).encode(no_checkpoint)
    cosine = pairs.finish(backend.forward(pairs.inputs)).scores[0]
    assert cosine == pytest.approx(float(normalized[0] @ normalized[1]), abs=1e-5)
