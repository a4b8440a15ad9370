"""The template head's key/value cache, kept across requests (issue 33): an LLM reranker's scores with it equal
a plain forward of each whole prompt, the head runs once per model, the store keeps to its bound and never hands
out what a forward extends, and a weightless copy runs nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from scorekit.models import LLMRerankerBackend, load_backend
from scorekit.models.base import Encoded, no_checkpoint
from scorekit.models.loaded import NoWeights
from scorekit.models.prefix_cache import HeadCache
from scorekit.models.tokens import Meter
from scorekit.tasks import Chunking, PairOptions
from tests.tiny_models import build_gemma_reranker, build_qwen3_reranker

QUERY = "What is the capital of France?"
DOCS = ["The capital of Brazil is Brasilia.", "Paris", "The capital of France is Paris, and it is large.", "no"]
LONG = " ".join(f"The capital of France is Paris, document number {i} talks about it." for i in range(30))
INSTRUCTION = "Given a question, find the passage that answers it"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_reranker(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture
def backend(qwen3_dir: Path) -> LLMRerankerBackend:
    """A fresh backend per test: its store starts empty, and a test may swap it or hook its model."""
    loaded = load_backend(str(qwen3_dir), kind="llm-reranker")
    assert isinstance(loaded, LLMRerankerBackend)
    return loaded


def _encode(backend: LLMRerankerBackend, queries: list[str], documents: list[str], **options: Any) -> list[Encoded]:
    return backend.plan_pairs(queries, documents, PairOptions(**options)).encode(no_checkpoint).inputs


def _plain(backend: LLMRerankerBackend, batch: list[Encoded]) -> torch.Tensor:
    """Each whole prompt through the model alone: no cache, no padding, default positions."""
    labels = list(backend._labels)
    with torch.inference_mode():
        return torch.stack(
            [backend._model(input_ids=torch.tensor([item.input_ids.tolist()])).logits[0, -1, labels] for item in batch]
        ).float()


def _assert_plain(backend: LLMRerankerBackend, batch: list[Encoded]) -> None:
    got, expected = torch.stack(backend.forward(batch)), _plain(backend, batch)
    assert torch.allclose(got, expected, rtol=0, atol=1e-5), (got - expected).abs().max()


def _one_request(backend: LLMRerankerBackend) -> list[Encoded]:
    return _encode(backend, [QUERY], DOCS)


def _several_requests(backend: LLMRerankerBackend) -> list[Encoded]:
    first, second = _encode(backend, [QUERY], DOCS[:3]), _encode(backend, ["Where is Brasilia?"], DOCS[:2])
    single = _encode(backend, ["one request, one document"], ["x"])
    return [first[0], second[0], first[1], single[0], second[1], first[2]]


def _instruction(backend: LLMRerankerBackend) -> list[Encoded]:
    return _encode(backend, [QUERY], DOCS, instruction=INSTRUCTION)


def _instruction_beside_the_default(backend: LLMRerankerBackend) -> list[Encoded]:
    given = _encode(backend, ["Where is Brasilia?"], DOCS[:3], instruction=INSTRUCTION)
    return [*_encode(backend, [QUERY], DOCS[:2]), *given, *_encode(backend, ["x"], ["y"], instruction="z")]


def _n_to_n(backend: LLMRerankerBackend) -> list[Encoded]:
    return _encode(backend, ["a", "b", "c"], DOCS[:3])


def _windows(backend: LLMRerankerBackend) -> list[Encoded]:
    encoded = _encode(backend, [QUERY], [LONG, "Paris"], chunking=Chunking(overlap=8))
    assert len(encoded) > 3  # the long document is several windows
    return encoded


def _truncated(backend: LLMRerankerBackend) -> list[Encoded]:
    encoded = _encode(backend, [QUERY * 4], [LONG, DOCS[2]], truncate=120, side="left")
    assert all(item.truncated and item.cost <= 120 for item in encoded[:1])
    return encoded


CASES: dict[str, Callable[[LLMRerankerBackend], list[Encoded]]] = {
    "one request": _one_request,
    "several requests in one batch": _several_requests,
    "an instruction given": _instruction,
    "an instruction beside the default one": _instruction_beside_the_default,
    "N:N pairs": _n_to_n,
    "chunked windows": _windows,
    "truncation": _truncated,
}


@pytest.mark.parametrize("case", CASES)
def test_scores_with_the_head_cache_are_those_of_plain_forwards(backend: LLMRerankerBackend, case: str) -> None:
    """Cold (the head runs and is kept), then warm (the kept head is used), and after another request: every
    score equals the model's plain forward of the whole prompt to 1e-5."""
    batch = CASES[case](backend)
    _assert_plain(backend, batch)
    assert len(backend.head_cache) >= 1, "the batch used a head and kept it"
    _assert_plain(backend, batch)
    _assert_plain(backend, _encode(backend, ["Is Paris in France?"], DOCS[1:3]))
    _assert_plain(backend, batch)


def test_a_gemma_reranker_s_head_starts_with_bos_and_scores_as_plain_forwards(tmp_path: Path) -> None:
    loaded = load_backend(str(build_gemma_reranker(tmp_path / "gemma")), kind="llm-reranker")
    assert isinstance(loaded, LLMRerankerBackend)
    assert loaded.heads and all(head[0] == loaded._tokenizer.bos_token_id for head in loaded.heads)
    for _ in range(2):
        _assert_plain(loaded, _several_requests(loaded))


@contextmanager
def _calls(backend: LLMRerankerBackend) -> Iterator[list[dict[str, Any]]]:
    """The model's calls while inside, each as the keyword arguments it was given."""
    calls: list[dict[str, Any]] = []

    def record(_module: torch.nn.Module, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append(kwargs)

    handle = backend._model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def _first_position(call: dict[str, Any]) -> int:
    """The earliest position a call runs a token at (no position ids given: from 0)."""
    positions = call.get("position_ids")
    return 0 if positions is None else int(positions.min())


def test_the_head_runs_once_across_requests(backend: LLMRerankerBackend) -> None:
    """The head of a request that gives no instruction is the tokens before its query (the template's own
    instruction included; the space before the query's first word may be a token of its own, which the head
    leaves out, as a word can take it). The first request runs it once, as one row of its tokens; later
    requests run no token at a position before its end."""
    prompt = backend._prompts([QUERY], DOCS[:1], None, Meter(no_checkpoint))[0]
    head = backend.heads[0]
    assert head.tolist() == prompt.ids[: len(head)] and prompt.query[0] - 1 <= len(head) <= prompt.query[0]
    with _calls(backend) as first:
        backend.forward(_encode(backend, [QUERY], DOCS))
    runs_head = [call for call in first if _first_position(call) < len(head)]
    assert len(runs_head) == 1 and runs_head[0]["input_ids"].tolist() == [head.tolist()]
    with _calls(backend) as later:
        backend.forward(_several_requests(backend))
        backend.forward(_encode(backend, ["Where is Paris?"], DOCS[:1]))
    assert later and all(_first_position(call) >= len(head) for call in later)
    assert len(later) == 3  # the batch's prefixes and rests, then the lone prompt's rest


def test_past_the_bound_heads_are_dropped_and_the_scores_stay_plain(backend: LLMRerankerBackend) -> None:
    """Two heads (with and without an instruction) in a store of one: each request drops the other's head and
    runs its own again; a store whose bytes hold no head keeps none. The scores stay those of plain forwards."""
    backend.head_cache = HeadCache(backend._model.config, max_entries=1)
    default, given = _encode(backend, [QUERY], DOCS), _encode(backend, [QUERY], DOCS, instruction=INSTRUCTION)
    expected = {id(batch): _plain(backend, batch) for batch in (default, given)}
    for batch in (default, given, default, given):
        with _calls(backend) as calls:
            got = torch.stack(backend.forward(batch))
        assert sum(_first_position(call) == 0 for call in calls) == 1  # its head ran again after being dropped
        assert len(backend.head_cache) == 1
        assert torch.allclose(got, expected[id(batch)], rtol=0, atol=1e-5)
    backend.head_cache = HeadCache(backend._model.config, max_bytes=1024)
    for batch in (default, default):
        _assert_plain(backend, batch)
        assert len(backend.head_cache) == 0 and backend.head_cache.nbytes == 0


def test_a_weightless_backend_loads_without_running_anything(qwen3_dir: Path, backend: LLMRerankerBackend) -> None:
    """The copy of a model served by a host process knows its heads (tokenized at load) and runs none."""
    weightless = load_backend(str(qwen3_dir), kind="llm-reranker", weights=False)
    assert isinstance(weightless, LLMRerankerBackend)
    assert [head.tolist() for head in weightless.heads] == [head.tolist() for head in backend.heads]
    assert len(weightless.head_cache) == 0
    with pytest.raises(NoWeights):
        weightless.forward(_encode(weightless, [QUERY], DOCS))


# -- the store alone ---------------------------------------------------------------------------------------------


def _head(tokens: int, fill: float = 1.0) -> DynamicCache:
    """A two-layer cache of one row: ``tokens`` positions of two heads of 4 dimensions (float32: 64 bytes per
    token and layer, keys and values)."""
    tensor = torch.full((1, 2, tokens, 4), fill)
    return DynamicCache(ddp_cache_data=[(tensor, tensor), (tensor, tensor)])


def _fetch(store: HeadCache, key: bytes, runs: list[bytes], tokens: int = 3, rows: int = 1) -> Any:
    def run() -> DynamicCache:
        runs.append(key)
        return _head(tokens)

    return store.fetch(key, rows, run)


def test_the_store_drops_the_least_recently_used_head_past_its_entries() -> None:
    store, runs = HeadCache(None, max_entries=2), []
    for key in (b"a", b"b", b"a", b"c", b"a", b"b"):
        _fetch(store, key, runs)
    assert runs == [b"a", b"b", b"c", b"b"]  # "a" was used after "b", so "c" dropped "b", which ran again
    assert len(store) == 2 and store.nbytes == 2 * 3 * 2 * 64


def test_the_store_keeps_to_its_bytes_and_never_keeps_a_head_bigger_than_them() -> None:
    store, runs = HeadCache(None, max_bytes=5 * 2 * 64), []
    _fetch(store, b"a", runs, tokens=2)
    _fetch(store, b"b", runs, tokens=2)
    assert len(store) == 2 and store.nbytes == 4 * 2 * 64
    _fetch(store, b"c", runs, tokens=2)  # past the bytes: "a" goes
    assert len(store) == 2 and store.nbytes == 4 * 2 * 64
    cache = _fetch(store, b"big", runs, tokens=6)
    assert cache.get_seq_length() == 6 and len(store) == 2 and b"big" not in store._entries
    _fetch(store, b"big", runs, tokens=6)
    assert runs == [b"a", b"b", b"c", b"big", b"big"]


def test_the_store_hands_out_a_new_cache_that_a_forward_may_extend() -> None:
    """What a caller extends (as a forward does, in place on the cache object) never reaches the kept head."""
    store, runs = HeadCache(None), []
    for rows in (1, 3, 1):
        cache = _fetch(store, b"head", runs, rows=rows)
        assert cache.get_seq_length() == 3 and cache.layers[0].keys.shape[0] == rows
        cache.update(torch.zeros(rows, 2, 5, 4), torch.zeros(rows, 2, 5, 4), 0)
        cache.batch_select_indices(torch.tensor([0, 0]))
    assert runs == [b"head"]
    assert store._entries[b"head"].cache.layers[0].keys.shape == (1, 2, 3, 4)


def test_the_store_keeps_its_bound_and_count_under_threads() -> None:
    store = HeadCache(None, max_entries=3)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(200):
                cache = _fetch(store, bytes([(seed * 7 + i) % 5]), [], tokens=1 + (seed + i) % 3)
                assert cache.get_seq_length() >= 1
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(store) <= 3
    assert store.nbytes == sum(entry.nbytes for entry in store._entries.values())
