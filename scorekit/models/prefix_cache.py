"""A model's key/value caches of the prompt heads every request repeats, kept across requests.

An LLM reranker's prompts start with the template's own tokens (a system prompt, an instruction line) that are the
same for every request: their keys and values are computed once per model and kept here, and every batch that
starts with them runs only what follows.

The store is bounded: at most ``max_entries`` heads and ``max_bytes`` of key/value tensors. Past either bound the
least recently used heads are dropped (a later batch that needs one runs it again, and it is kept anew); a head
larger than ``max_bytes`` alone is never kept, so its batch uses it and the next one runs it again, as if there
were no store. The forward runs on worker threads, possibly several (``--model-workers``): a lock guards the
entries, and a head is computed outside it, so a hit never waits on another thread's miss (two threads that miss
the same head at once both run it, and the second one's is kept).

A forward appends to the cache it is given (transformers' ``DynamicCache``), so the store never hands out the
cache it keeps: each caller gets a new cache object over the kept tensors. That shares their memory safely, since
a forward extends a layer's keys and values with ``torch.cat`` into new tensors and never writes into old ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import DynamicCache

MAX_ENTRIES = 8
# A head of ~100 tokens of an 8B model in bfloat16 (36 layers, 8 key/value heads of 128) is about 15 MiB: room
# for a few of the largest rerankers' heads, and a small share of any device that runs them.
MAX_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class _Entry:
    cache: Any  # a DynamicCache that nothing extends: only copied
    nbytes: int


class HeadCache:
    """Key/value caches of prompt heads, keyed by the heads' token ids, within the bounds of the module
    docstring. ``config`` is the model's: a copy gets its layers' kinds (full or sliding attention) from it."""

    def __init__(self, config: Any, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._config = config
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """The kept caches' key and value tensors, in bytes."""
        return self._bytes

    def fetch(self, key: bytes, rows: int, run: Callable[[], Any]) -> Any:
        """A new cache of head ``key`` (its token ids' bytes) for ``rows`` rows, the caller's to extend: a copy
        of the kept one, else of the one ``run()`` computes (kept if the bound allows)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            cache = run()
            entry = _Entry(cache, _nbytes(cache))
            self._keep(key, entry)
        return _copy(entry.cache, rows, self._config)

    def _keep(self, key: bytes, entry: _Entry) -> None:
        """Keep ``entry`` as the most recent, dropping the least recent ones past the bound (or not keeping it,
        when it alone is over ``max_bytes``)."""
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes += entry.nbytes - (old.nbytes if old else 0)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes


def _nbytes(cache: Any) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def _copy(cache: Any, rows: int, config: Any) -> Any:
    """A new cache holding ``cache``'s keys and values for each of ``rows`` rows (``cache`` holds one)."""
    layers = [(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)) for layer in cache.layers]
    return DynamicCache(ddp_cache_data=layers, config=config)
