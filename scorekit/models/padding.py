"""A batch of encoded inputs as the model's tensors: padded, masked, and on the model's device."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from .base import Encoded


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Padding is masked out, so any valid id serves when the tokenizer has no pad token."""
    pad = tokenizer.pad_token_id
    return pad if isinstance(pad, int) else 0


def pad_batch(batch: Sequence[Encoded], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-pad to the longest input; the attention mask hides the padding from attention and pooling."""
    ids, mask = padded([item.input_ids for item in batch], pad_id)
    inputs = {"input_ids": ids, "attention_mask": mask}
    types = [item.token_type_ids for item in batch if item.token_type_ids is not None]
    if len(types) == len(batch):
        inputs["token_type_ids"] = padded(types, 0)[0]
    if device.type == "cuda":
        # From page-locked memory the copy is one DMA with no staging copy, and it is queued without waiting:
        # the forward that reads it runs on the same stream, and torch keeps the pinned block until it is done.
        return {key: value.pin_memory().to(device, non_blocking=True) for key, value in inputs.items()}
    return {key: value.to(device) for key, value in inputs.items()}


def padded(rows: Sequence[array[int]], value: int, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows as one int64 tensor, padded with ``value`` to the longest on the right (or the left), and the
    mask of their real tokens (1; padding 0).

    The rows' bytes are joined and copied into the tensor's unpadded places in one go (row-major, as joined),
    so no Python int is made per token."""
    lengths = torch.tensor([len(row) for row in rows])
    width = int(lengths.max())
    places = torch.arange(width)
    real = places >= (width - lengths)[:, None] if left else places < lengths[:, None]
    ids = torch.full(real.shape, value, dtype=torch.long)
    joined = bytearray().join(rows)
    if joined:  # frombuffer refuses an empty buffer
        ids[real] = torch.frombuffer(joined, dtype=torch.int32).long()
    return ids, real.long()
