"""An embedding in the forms a client may ask for besides JSON floats, each made from the float vector the model
answered: base64 of its float32 bytes (OpenAI's ``encoding_format``, Cohere's ``base64``) and Cohere's quantized
``embedding_types``, as sentence-transformers' ``quantize_embeddings`` computes them.

Cohere calibrates int8 and uint8 on its servers; here each vector is its own calibration, so the answer never
depends on the other texts of a request: its values are cut into 255 equal steps of
``[-max|v|, max|v|]``, which is ``quantize_embeddings(v, "uint8", ranges=[[-m]*d, [m]*d])`` with
``m = max|v|`` (int8 is that less 128). binary and ubinary are the signs, 8 dimensions a byte.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np

Quantized = Literal["int8", "uint8", "binary", "ubinary"]


def base64_of(vector: list[float]) -> str:
    """The float32 values, little-endian, base64-encoded (what OpenAI sends for ``encoding_format: base64``)."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def quantized(vectors: list[list[float]], kind: Quantized) -> list[list[int]]:
    """Each vector quantized (in float32 arithmetic, step for step as ``quantize_embeddings``):

    - ``uint8``: ``floor((v + m) / (2m / 255))`` clipped to [0, 255], with ``m`` the vector's largest absolute
      value (a vector of zeros is all 0); ``int8``: the same less 128, in [-128, 127].
    - ``ubinary``: one bit per dimension, 1 where the value is above 0, packed 8 a byte with the first
      dimension in the highest bit (``numpy.packbits``; the last byte padded with 0 bits); ``binary``: each
      byte less 128, as a signed int8.
    """
    values = np.asarray(vectors, dtype=np.float32)
    if kind in ("binary", "ubinary"):
        packed = np.packbits(values > 0, axis=-1)
        signed = kind == "binary"
        rows: list[list[int]] = (packed.astype(np.int16) - 128 if signed else packed).tolist()
        return rows
    largest = np.abs(values).max(axis=-1, keepdims=True)
    steps = (largest - (-largest)) / 255
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((values - (-largest)) / steps), 0, 255)
    shifted = buckets - 128 if kind == "int8" else buckets
    out: list[list[int]] = shifted.astype(np.int16).tolist()
    return out
