"""Padding from compact token arrays: the same tensors as padding Python lists of ints, right or left."""

from __future__ import annotations

import random

import torch

from scorekit.models.base import Encoded, token_array
from scorekit.models.padding import pad_batch, padded


def _by_lists(rows: list[list[int]], value: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What padding lists of ints makes (the reference)."""
    width = max(map(len, rows))

    def pad(row: list[int], fill: int) -> list[int]:
        padding = [fill] * (width - len(row))
        return padding + row if left else row + padding

    return torch.tensor([pad(row, value) for row in rows]), torch.tensor([pad([1] * len(row), 0) for row in rows])


def test_padded_equals_padding_lists_on_either_side() -> None:
    chance = random.Random(12)
    for _ in range(50):
        rows = [
            [chance.randrange(250_000) for _ in range(chance.randrange(0, 12))] for _ in range(chance.randint(1, 6))
        ]
        if not any(rows):
            rows.append([7])
        for left in (False, True):
            ids, mask = padded([token_array(row) for row in rows], 3, left=left)
            expected_ids, expected_mask = _by_lists(rows, 3, left)
            assert ids.dtype == mask.dtype == torch.int64
            assert torch.equal(ids, expected_ids) and torch.equal(mask, expected_mask)


def test_padded_rows_of_no_tokens() -> None:
    ids, mask = padded([token_array([]), token_array([])], 0)
    assert ids.shape == mask.shape == (2, 0)


def test_pad_batch_sends_type_ids_only_when_every_input_has_them() -> None:
    typed = Encoded(token_array([101, 7, 102]), token_array([0, 0, 1]))
    short = Encoded(token_array([101, 102]), token_array([0, 0]))
    inputs = pad_batch([typed, short], 0, torch.device("cpu"))
    assert inputs["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert inputs["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert "token_type_ids" not in pad_batch([typed, Encoded(token_array([5]))], 0, torch.device("cpu"))
