"""``--runtime onnx``: a bi-encoder's or cross-encoder's forward in ONNX Runtime, on the CPU, in float32."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from . import Forward
from .export import cached_export


def onnx_forward(model: PreTrainedModel, output: str, input_names: Sequence[str], root: Path) -> Forward:
    """``model`` exported to ONNX (or its cached export reused) and run in an ONNX Runtime session with torch's
    thread count and no busy-waiting (the reason the CLI sets OMP_WAIT_POLICY=PASSIVE)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")

    def load(path: Path) -> Any:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    session = cached_export(model, output, input_names, root, onnxruntime.__version__, load)
    fed = [node.name for node in session.get_inputs()]  # the exporter drops an input the graph never reads

    def run(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        outputs: list[Any] = session.run([output], {name: inputs[name].numpy() for name in fed})
        return torch.from_numpy(outputs[0])

    return run
