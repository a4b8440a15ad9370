"""``--runtime torchscript``: a bi-encoder's or cross-encoder's forward as a TorchScript trace, on the model's own
device and dtype."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from . import Forward
from .export import Output, padded_sample

logger = logging.getLogger("scorekit.models")


def traced_forward(model: PreTrainedModel, output: str, input_names: Sequence[str]) -> Forward:
    """``model`` traced with TorchScript on its own device and dtype, checked against the module at another shape.

    Why: an eager forward gives the interpreter lock up around each of its hundreds of operators and must win it
    back every time; beside a busy event loop each win can wait the switch interval, which on a GPU (where a
    launch takes microseconds) dwarfs the forward (``python -m bench.gil``). The trace runs its graph in C++ and
    gives the lock up a few times per call. A trace records one path through the module's Python: a model whose
    output would differ at another batch size or length is refused here rather than served wrong.
    """
    started = time.monotonic()
    wrapped = Output(model, output, input_names)
    sample = padded_sample(input_names, (8, 5), model.device)
    with warnings.catch_warnings(), torch.inference_mode():
        # The tracer's notes on transformers' Python branches say nothing an operator can act on: the check does.
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(wrapped, tuple(sample.values()), check_trace=False)  # type: ignore[no-untyped-call]
        other = padded_sample(input_names, (3, 11, 7), model.device)
        expected, got = wrapped(*other.values()), traced(*other.values())
    tolerance = 1e-4 if expected.dtype == torch.float32 else 1e-2
    if expected.shape != got.shape or not torch.allclose(expected.float(), got.float(), atol=tolerance, rtol=0):
        raise ValueError(
            f"Model {model.name_or_path!r} cannot run as a TorchScript trace: the trace answers differently from"
            " the model at another batch shape; serve it with --runtime torch."
        )
    logger.info("traced %s with TorchScript in %.1f s", model.name_or_path, time.monotonic() - started)

    def run(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        result: torch.Tensor = traced(*(inputs[name] for name in input_names))
        return result

    return run
