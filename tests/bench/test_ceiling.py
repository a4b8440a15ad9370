"""bench.ceiling's two measurements: the model's operations per document agree with a BERT's matrix products
counted by hand (tests/tiny_models.py's shape), and the CPU's matrix-multiply rate is a positive number of
operations per CPU second."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer

from bench.ceiling import flops_per_document, matmul_peak
from tests.tiny_models import build_cross_encoder

HIDDEN, LAYERS, INNER = 32, 2, 64  # tests.tiny_models.build_cross_encoder's shape


def test_operations_per_document_are_a_berts_matrix_products(tmp_path: Path) -> None:
    folder = build_cross_encoder(tmp_path / "ce")
    bodies = [{"query": "what is scored", "documents": ["a short one", "a much longer document than the other"]}]
    width = len(AutoTokenizer.from_pretrained(folder)(bodies[0]["query"], bodies[0]["documents"][1])["input_ids"])
    # Per token and layer: the Q, K, V and output projections and the two feed-forward products; per sequence the
    # pooler and the one-label classifier. Attention's own products run in SDPA's CPU kernel, which the counter
    # does not count (1-2% of the products at the peers' ~40 tokens).
    per_layer = width * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * INNER)
    per_sequence = 2 * (LAYERS * per_layer + HIDDEN * HIDDEN + HIDDEN)
    assert flops_per_document(folder, bodies) == per_sequence


def test_the_matrix_multiply_rate_is_measured_in_operations_per_cpu_second() -> None:
    rate = matmul_peak(torch.float32, [(64, 64, 64)], seconds=0.05)
    assert 1e6 < rate < 1e14  # anything from a very slow CPU to well past any one core's peak
