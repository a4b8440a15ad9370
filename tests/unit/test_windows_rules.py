"""E8 (docs/invariants.md): the windows over a long document share at most half a window, so every window moves on.

``--chunk-overlap`` has no upper bound of its own (a model's room for the document depends on its query), so
``token_windows`` clamps it: neighbours share ``min(overlap, room // 2)`` tokens. Without the clamp an overlap
of a whole window makes no progress (the request never ends), and one of more than half a window makes up to
``room`` times the windows the document needs, every one of them a model input. The mutation audit of issue 28
found the clamp guarded by no test: the end-to-end tests of long documents use an overlap far below half a
window. Checked here through ``token_windows`` alone, over drawn lengths, rooms and options.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import example, given, settings
from hypothesis import strategies as st

from scorekit.models.windows import token_windows
from scorekit.tasks import Chunking


def check_windows(length: int, room: int, chunking: Chunking) -> None:
    windows = token_windows(length, room, chunking)
    if length <= room:
        assert windows == [(0, length)]
        return
    shared = min(chunking.overlap, room // 2)
    assert windows[0][0] == 0
    assert all(0 <= start < end <= length and end - start <= room for start, end in windows)
    for (start, end), (next_start, _) in pairwise(windows):
        assert end - start == room  # only the last window may be short
        assert end - next_start == shared  # neighbours share exactly the clamped overlap
        assert next_start - start >= room - room // 2  # so every window moves on by half a window at least
    if chunking.max_chunks is None or len(windows) < chunking.max_chunks:
        assert windows[-1][1] == length  # the whole document, unless max_chunks cut it short
    else:
        assert len(windows) == chunking.max_chunks


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 3000),
    room=st.integers(1, 300),
    overlap=st.integers(0, 299),
)
@example(length=100, room=10, overlap=8)  # more than half a window: the clamp makes it 5
def test_E8_neighbouring_windows_share_at_most_half_a_window(length: int, room: int, overlap: int) -> None:
    """Every window moves on, and neighbours share ``min(overlap, room // 2)`` tokens, for an overlap below a
    window (larger ones are drawn in the test below, with ``max_chunks`` bounding the windows)."""
    check_windows(length, room, Chunking(None, min(overlap, room - 1)))


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 3000),
    room=st.integers(1, 300),
    overlap=st.integers(0, 3000),
    max_chunks=st.integers(1, 20),
)
@example(length=100, room=10, overlap=10, max_chunks=3)  # a whole window: unclamped, it would never move on
@example(length=100, room=10, overlap=500, max_chunks=3)
def test_E8_an_overlap_of_a_window_or_more_still_moves_on(
    length: int, room: int, overlap: int, max_chunks: int
) -> None:
    """An overlap of a whole window or more (``--chunk-overlap`` is not bounded by the model's room) still gives
    windows that move on by half a window at least, and ``max_chunks`` of them at most."""
    check_windows(length, room, Chunking(max_chunks, overlap))
