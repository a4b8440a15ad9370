"""Fair share per API key and per-key quotas, over real sockets: two keys, one flooding; keys of different weights;
the requests and items a key may use a minute, answered 429 with Retry-After and the RateLimit fields; and the key
file's fields, read by ``scorekit serve``.

The model is held on a first batch, so the requests behind it queue in a known order, and each batch is recorded by
the lengths of its inputs, which tell the keys' requests apart.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.cli import parse
from scorekit.engine import Engine
from scorekit.load import Board
from scorekit.middleware.quota import KeyQuotas, TokenBucket
from scorekit.settings import DEFAULT_MODEL_NAME, ApiKey, EngineConfig, Settings
from tests.cli.test_parsing import refused
from tests.e2e.test_priority_and_deadlines import BLOCKER, Recorded, finished, post
from tests.hardening.conftest import scrape
from tests.live import Live, serve, wait_for

pytestmark = pytest.mark.e2e

KEYS = {
    "flood": ApiKey("flood-1f0e7c", name="flood"),
    "quiet": ApiKey("quiet-9a2b44", name="quiet"),
    "light": ApiKey("light-77c1d0", name="light"),
    "heavy": ApiKey("heavy-3e5f18", name="heavy", weight=2.0),
    "requests": ApiKey("requests-5d6e01", name="requests", requests_per_minute=2),
    "items": ApiKey("items-0b8c2f", name="items", items_per_minute=10),
}
LETTERS = "abcdefghijklmnopqrst"


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name].key}"}


def keyed_post(live: Live, name: str, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = post(live, body, headers=bearer(name))
    return answer


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ScorekitApp, Engine, Recorded, Live]]:
    # Small batches and no small-job lane: one queue, whose order the keys' shares decide.
    engine = EngineConfig(max_batch_size=4, max_batch_tokens=4096, small_job_lane=0, max_queue_wait=30.0)
    app = create_app(Settings.for_model(engine=engine, api_keys=tuple(KEYS.values())))
    with serve(app) as live:
        assert app.engine is not None
        yield app, app.engine, Recorded(app.engine, monkeypatch), live


def test_a_flooding_key_does_not_hold_back_another_keys_request(
    keyed: tuple[ScorekitApp, Engine, Recorded, Live],
) -> None:
    """Twelve one-input requests of one key queue (3 tokens each), then one of another key (6 tokens): it rides
    the very next batch; in arrival order it would wait for three batches of the flood."""
    _, engine, recorded, live = keyed
    blocker = keyed_post(live, "flood", {"input": BLOCKER})
    assert recorded.entered.wait(30)
    flood = []
    for n in range(12):
        flood.append(keyed_post(live, "flood", {"input": LETTERS[n]}))
        assert wait_for(lambda queued=n + 1: engine.snapshot().queued_items == queued)  # type: ignore[misc]
    quiet = keyed_post(live, "quiet", {"input": "x y z w"})
    assert wait_for(lambda: engine.snapshot().queued_items == 13)
    recorded.release.set()
    finished(blocker, *flood, quiet)
    assert all(answer["status"] == 200 for answer in (*flood, quiet))
    assert recorded.batches[0] == [9] and sorted(recorded.batches[1]) == [3, 3, 3, 6]


def test_backlogged_keys_share_the_model_by_their_weights(keyed: tuple[ScorekitApp, Engine, Recorded, Live]) -> None:
    """Keys of weight 1 and 2, each with 20 inputs queued: the heavy key's inputs are twice as long, so at equal
    shares of items it gets twice the tokens, its weight. Shares in tokens ignoring the weights would give the
    light key two inputs for each of the heavy key's."""
    _, engine, recorded, live = keyed
    blocker = keyed_post(live, "quiet", {"input": BLOCKER})
    assert recorded.entered.wait(30)
    light = keyed_post(live, "light", {"input": list(LETTERS)})  # 3 tokens each
    assert wait_for(lambda: engine.snapshot().queued_items == 20)
    heavy = keyed_post(live, "heavy", {"input": [f"x y z {letter}" for letter in LETTERS]})  # 6 tokens each
    assert wait_for(lambda: engine.snapshot().queued_items == 40)
    recorded.release.set()
    finished(blocker, light, heavy)
    first = Counter(length for batch in recorded.batches[1:6] for length in batch)
    assert first == {3: 10, 6: 10}


def test_a_key_past_its_requests_a_minute_gets_429_with_retry_after_and_the_ratelimit_fields(
    keyed: tuple[ScorekitApp, Engine, Recorded, Live],
) -> None:
    _, engine, recorded, live = keyed
    recorded.release.set()
    answers = [live.request("GET", "/v1/models", headers=bearer("requests")) for _ in range(2)]
    assert [status for status, _, _ in answers] == [200, 200]
    assert [headers["ratelimit-remaining"] for _, headers, _ in answers] == ["1", "0"]
    assert answers[0][1]["ratelimit-limit"] == "2" and answers[0][1]["ratelimit-policy"] == "2;w=60"
    before = engine.snapshot().worker.items
    status, headers, raw = live.request("POST", "/v1/embeddings", {"input": "x"}, headers=bearer("requests"))
    assert status == 429
    assert headers["retry-after"] == "30"  # one request refills in 60 / 2 s
    assert (headers["ratelimit-limit"], headers["ratelimit-remaining"], headers["ratelimit-reset"]) == ("2", "0", "60")
    error = json.loads(raw)["error"]
    assert (error["code"], error["type"]) == (429, "RateLimitError") and "2 requests a minute" in error["message"]
    assert engine.snapshot().worker.items == before  # refused before any work
    assert live.request("GET", "/v1/models", headers=bearer("quiet"))[0] == 200  # another key's quota is its own


def test_a_key_past_its_items_a_minute_gets_429_before_any_tokenizing(
    keyed: tuple[ScorekitApp, Engine, Recorded, Live],
) -> None:
    _, engine, recorded, live = keyed
    recorded.release.set()
    before = scrape(live)
    status, headers, _ = live.request("POST", "/v1/embeddings", {"input": list(LETTERS[:10])}, headers=bearer("items"))
    assert status == 200 and headers["ratelimit-remaining"] == "0"  # exactly the quota
    items = engine.snapshot().worker.items
    status, headers, raw = live.request("POST", "/v1/embeddings", {"input": "x"}, headers=bearer("items"))
    assert status == 429 and headers["retry-after"] == "6"  # one input refills in 60 / 10 s
    assert "10 model inputs a minute" in json.loads(raw)["error"]["message"]
    status, _, raw = live.request("POST", "/v1/embeddings", {"input": list(LETTERS[:11])}, headers=bearer("items"))
    assert status == 400 and "more than this API key's quota of 10 a minute" in json.loads(raw)["error"]["message"]
    assert engine.snapshot().worker.items == items
    after = scrape(live)
    rejected = ("scorekit_requests_rejected_total", (("model", DEFAULT_MODEL_NAME), ("reason", "rate_limited")))
    tokenized = ("scorekit_tokenize_duration_seconds_count", (("model", DEFAULT_MODEL_NAME),))
    assert after[rejected] - before.get(rejected, 0.0) == 2
    assert after[tokenized] - before.get(tokenized, 0.0) == 1  # the first request only


def test_a_quota_bucket_holds_a_minutes_worth_and_no_more() -> None:
    clock = iter([0.0, 600.0, 600.0, 610.0])  # one reading a take
    bucket = TokenBucket(3, clock=lambda: next(clock))
    assert bucket.take(3) == 0.0  # a fresh key may spend its whole minute at once
    assert bucket.take(4) == pytest.approx(20.0)  # ten idle minutes refill 3, never 4: 1 more in 20 s
    assert bucket.take(3) == 0.0
    assert bucket.take(1) == pytest.approx(10.0)  # 0.5 refilled in 10 s: 0.5 more takes 10 s


@pytest.mark.parametrize("limit", [1, 3, 7, 60, 1000])
def test_a_bucket_holds_exactly_its_limit_at_once_and_not_one_more(limit: int) -> None:
    """Taken at one instant, ``limit`` single units all fit (their refill times add up to a minute, give or take a
    float's last bit) and the next waits one unit's refill."""
    bucket = TokenBucket(limit, clock=lambda: 1000.0)
    assert [bucket.take(1) for _ in range(limit)] == [0.0] * limit
    assert bucket.take(1) == pytest.approx(60 / limit)
    assert dict(bucket.headers())[b"ratelimit-remaining"] == b"0"


def test_two_front_ends_take_from_one_bucket_per_key(tmp_path: Path) -> None:
    """A key's buckets on a board (``--api-processes``): what one front end takes, the other finds gone, and either
    says the same in its headers; another key's bucket is its own."""
    Board.create(tmp_path / "board").close()
    first, second = Board.attach(tmp_path / "board", 0), Board.attach(tmp_path / "board", 1)
    try:
        keys = [ApiKey("k-a", requests_per_minute=3, items_per_minute=4), ApiKey("k-b", requests_per_minute=3)]
        here = [KeyQuotas(key, place=n, board=first, clock=lambda: 50.0) for n, key in enumerate(keys)]
        there = [KeyQuotas(key, place=n, board=second, clock=lambda: 50.0) for n, key in enumerate(keys)]
        assert here[0].requests is not None and there[0].requests is not None and there[1].requests is not None
        assert here[0].items is not None and there[0].items is not None
        assert here[0].requests.take(2) == 0.0
        assert dict(there[0].requests.headers())[b"ratelimit-remaining"] == b"1"
        assert there[0].requests.take(1) == 0.0
        assert here[0].requests.take(1) == pytest.approx(20.0)  # the bucket is spent on both
        assert there[1].requests.take(3) == 0.0  # the other key's is whole
        assert there[0].items.take(4) == 0.0 and here[0].items.take(1) == pytest.approx(15.0)
    finally:
        first.close()
        second.close()


def test_the_key_file_gives_each_key_a_name_a_weight_and_quotas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in [name for name in os.environ if name.startswith("SCOREKIT_")]:
        monkeypatch.delenv(variable)
    keys = tmp_path / "keys"
    keys.write_text("# name, share, quotas\nk-plain\nk-alice name=alice weight=2.5 requests_per_minute=60\n")
    settings = parse(["serve", "--api-key", "k-alice", "--api-key-file", str(keys)]).settings
    assert settings.keys == (
        ApiKey("k-alice", name="alice", weight=2.5, requests_per_minute=60),  # the file's fields win
        ApiKey("k-plain", name="key-2"),
    )
    bad = {
        "k-secret weight=0\n": "weight must be a number more than 0",
        "k-secret requests_per_minute=0\n": "requests_per_minute must be a whole number, at least 1",
        "k-secret items_per_minute=ten\n": "items_per_minute 'ten' is not a number",
        "k-secret colour=blue\n": "expected NAME=VALUE fields",
        "k-secret weight=1 weight=2\n": "each once",
        "k-secret name=a\nk-other name=a\n": "holds one name twice",
    }
    for text, expected in bad.items():
        keys.write_text(text)
        line = refused(["serve", "--api-key-file", str(keys)], capsys)
        assert expected in line and "secret" not in line, line
