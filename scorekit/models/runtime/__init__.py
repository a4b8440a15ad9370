"""What runs a bi-encoder's or cross-encoder's forward: the torch module, its ONNX export in ONNX Runtime
(``--runtime onnx``, ``onnx.py``) or in OpenVINO (``--runtime openvino``, ``openvino.py``), or (``--runtime
torchscript``, ``torchscript.py``) its TorchScript trace on the model's own device; ``export.py`` exports and caches
the ONNX file both ONNX runtimes load. Tokenizing, padding, pooling and finishing stay the backend's, and so do the
batcher, the worker, cancellation and metrics: only the call that turns a padded batch into the module's one output
changes.

Why both ONNX runtimes: ``python -m bench.runtimes`` ran them on the same ONNX file. On an AMD EPYC without native
bf16, ONNX Runtime ran more items per CPU second than OpenVINO at batch 1 and 32 in float32; on an Intel Xeon with
AMX, OpenVINO ran more in float32, and in bfloat16 (which ONNX Runtime's CPU kernels lack) more than torch's own
bfloat16 forward (docs/models.md). Both are exact to 1e-6 in float32.

Each runtime's module is imported when a model asks for it, and ONNX Runtime and OpenVINO only inside it, so a
server that runs torch never loads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from scorekit.choices import Runtime, runtime_missing

# A batch's inputs by name (what padding.pad_batch makes) to the module's one output the backend reads.
Forward = Callable[[dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True, slots=True)
class ModelRuntime:
    """The runtime a model's forward runs in, where ONNX exports are cached (None: the user's cache), and how many
    threads call the forward at once (the model worker's; OpenVINO runs that many streams)."""

    name: Runtime = "torch"
    cache_dir: str | None = None
    callers: int = 1

    @property
    def runs_the_module(self) -> bool:
        """Whether the forward runs the torch module's own weights (torch, a trace of it); ONNX Runtime and OpenVINO
        hold copies of their own, so a backend lets the module go once the forward is made (half the memory)."""
        return self.name in ("torch", "torchscript")

    def forward(self, model: PreTrainedModel, output: str, input_names: Sequence[str]) -> Forward:
        """The call that gives ``model``'s ``output`` for a padded batch of ``input_names``."""
        if self.name == "torch":
            return lambda inputs: model(**inputs)[output]
        if self.name == "torchscript":
            from .torchscript import traced_forward

            return traced_forward(model, output, input_names)
        if (missing := runtime_missing(self.name)) is not None:
            raise ValueError(missing[0].upper() + missing[1:] + ".")
        from .export import cache_root

        if self.name == "openvino":
            from .openvino import openvino_forward

            return openvino_forward(model, output, input_names, cache_root(self.cache_dir), self.callers)
        from .onnx import onnx_forward

        return onnx_forward(model, output, input_names, cache_root(self.cache_dir))


TORCH = ModelRuntime()
