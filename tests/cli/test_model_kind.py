"""A model kind the folder's weights do not fit is refused, not served with a random head."""

from __future__ import annotations

from pathlib import Path

import pytest

from scorekit.models import default_model_path, load_backend


def test_a_cross_encoder_folder_is_no_causal_lm(cross_encoder_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot be served as a causal-lm: 6 of the weights") as refused:
        load_backend(str(cross_encoder_dir), kind="causal-lm")
    assert "its config.json names BertForSequenceClassification, which is a cross-encoder" in str(refused.value)


def test_a_bi_encoder_folder_is_no_cross_encoder() -> None:
    with pytest.raises(ValueError, match=r"cannot be served as a cross-encoder: 2 .* \(classifier.bias, classifier"):
        load_backend(default_model_path(), kind="cross-encoder")


def test_kinds_that_use_only_saved_weights_still_load(cross_encoder_dir: Path) -> None:
    """A cross-encoder's encoder is a usable bi-encoder: nothing it needs is missing, so it is not refused."""
    assert load_backend(str(cross_encoder_dir), kind="bi-encoder").kind == "bi-encoder"
    assert load_backend(str(cross_encoder_dir)).kind == "cross-encoder"
