"""Tokenizing in bounded pieces gives the tokenizer's own tokens: a long text cut at whitespace, a capped text's
first or last tokens, and the special tokens placed from the tokenizer's template, on a WordPiece (MiniLM), a
byte-level BPE (the tiny LLM rerankers') and a tokenizer whose pieces would not tokenize alike."""

from __future__ import annotations

import itertools
import random
from array import array
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from scorekit.models import default_model_path
from scorekit.models.base import Limits
from scorekit.models.files import Source, load_tokenizer
from scorekit.models.tokens import CHUNK_CHARS, PIECE_CHARS, Meter, TextTokenizer, piece_ranges
from scorekit.models.truncation import encode_pairs, split_budget
from tests.tiny_models import build_bpe_tokenizer

WORDS = ["alpha", "beta,", "gamma!", "  ", "unbelievably", "42", "\n", "Ünï", "de-lta", "(x)", "\t\t", "the"]


def _text(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _llama_style(folder: Path) -> Path:
    """A tokenizer with no pre-tokenizer whose normaliser prepends "▁" to every call, as Llama 2's does: a
    piece cut at whitespace gets a "▁" the whole text has not there."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"])
    tokenizer.train_from_iterator([_text(400, seed) for seed in range(5)], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", model_max_length=512).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["wordpiece", "byte-level", "llama-style"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    folder = tmp_path_factory.mktemp(request.param)
    path = {
        "wordpiece": lambda: Path(default_model_path()),
        "byte-level": lambda: build_bpe_tokenizer(folder, corpus=[_text(300)]),
        "llama-style": lambda: _llama_style(folder),
    }[request.param]()
    return load_tokenizer(Source(str(path)))


def _meter() -> Meter:
    return Meter(lambda units: None)


def test_pieces_are_cut_where_a_run_of_whitespace_starts() -> None:
    text = _text(3000)
    ranges = piece_ranges(text, 100)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(text)
    assert all(high == low for (_, high), (low, _) in itertools.pairwise(ranges))
    for low, high in ranges[:-1]:
        assert text[high].isspace() and not text[high - 1].isspace()
        assert high - low <= 100


def test_a_long_text_has_the_tokens_of_the_whole(tokenizer: PreTrainedTokenizerBase) -> None:
    tokens = TextTokenizer(tokenizer, joins=False)
    text = _text(20 * PIECE_CHARS // 6)
    assert len(text) > 10 * PIECE_CHARS
    whole = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    [found] = tokens.content([text], _meter(), offsets=True)
    assert found.complete and list(found.ids) == whole.ids and found.count == len(whole.ids)
    assert list(zip(found.starts, found.ends, strict=True)) == whole.offsets


def test_piece_cutting_is_off_where_pieces_would_tokenize_otherwise(tokenizer: PreTrainedTokenizerBase) -> None:
    llama_style = isinstance(tokenizer.backend_tokenizer.normalizer, normalizers.Sequence)
    assert TextTokenizer(tokenizer, joins=False).cuts_pieces is not llama_style


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("cap", [1, 300, 5000])
def test_a_capped_text_keeps_the_tokens_of_its_kept_end(
    tokenizer: PreTrainedTokenizerBase, side: str, cap: int
) -> None:
    tokens = TextTokenizer(tokenizer, joins=False)
    text = _text(60_000)
    whole = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    [found] = tokens.content([text], _meter(), cap=cap, side="right" if side == "right" else "left")
    assert found.count >= cap
    if side == "right":
        assert list(found.first(cap)) == whole[:cap]
    else:
        assert list(found.last(cap)) == whole[-cap:]
    if tokens.cuts_pieces:
        assert not found.complete and len(found.ids) < len(whole) // 4, "the whole text was tokenized"


def test_the_template_places_the_tokenizers_own_special_tokens() -> None:
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    template = TextTokenizer(load_tokenizer(Source(default_model_path()))).template
    first = tokenizer("what is it", add_special_tokens=False)["input_ids"]
    second = tokenizer("a thing", add_special_tokens=False)["input_ids"]
    joined = template.join_pair(*map(_ints, (first, second)), with_types=True)
    reference = tokenizer("what is it", "a thing")
    assert list(joined.input_ids) == reference["input_ids"]
    assert joined.token_type_ids is not None and list(joined.token_type_ids) == reference["token_type_ids"]
    single = template.join_single(_ints(first), with_types=True)
    assert list(single.input_ids) == tokenizer("what is it")["input_ids"]


def _ints(ids: list[int]) -> array[int]:
    return array("i", ids)


def test_a_step_of_exactly_one_unit_is_one_step_and_one_more_unit_is_two() -> None:
    """The checkpoint runs before the first work and before any spend that would take a step past
    CHUNK_CHARS: work that fills a step exactly stays in it; one unit more starts the next."""
    steps: list[int] = []
    meter = Meter(steps.append)
    half = CHUNK_CHARS // 2
    meter.spend(half)
    meter.spend(CHUNK_CHARS - half)  # exactly one unit so far: no checkpoint
    meter.spend(1)  # one more: the checkpoint reports the full unit
    meter.close()
    assert steps == [0, CHUNK_CHARS, 1]


def test_a_capped_query_keeps_the_longest_first_odd_token_of_the_whole() -> None:
    """With an odd budget both parts of a pair past half of it get half, and the longer one the odd token: a
    query capped one token above the longest document is still the longer, as the whole query is."""
    tokens = TextTokenizer(load_tokenizer(Source(default_model_path())))
    query, document = _text(60_000), _text(400, seed=1)  # the document: more tokens than the model takes
    limits = Limits(128, 128, "right")  # 125 content tokens: odd
    [capped] = encode_pairs(tokens, [query], [document], limits, _meter())
    whole = tokens.content([query], _meter())[0]
    doc = tokens.content([document], _meter())[0]
    assert doc.count > 128 and whole.count > doc.count
    keep_query, keep_document = split_budget(whole.count, doc.count, 125)
    assert (keep_query, keep_document) == (63, 62)
    expected = tokens.template.join_pair(whole.first(63), doc.first(62), with_types=True, truncated=True)
    assert capped == expected
