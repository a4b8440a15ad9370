"""``--runtime openvino``: a bi-encoder's or cross-encoder's forward compiled by OpenVINO for the CPU, in float32
or bfloat16."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
from transformers import PreTrainedModel

from . import Forward
from .export import cached_export, padded_sample

logger = logging.getLogger("scorekit.models")


def openvino_forward(
    model: PreTrainedModel, output: str, input_names: Sequence[str], root: Path, callers: int = 1
) -> Forward:
    """``model`` exported to ONNX (or its cached export reused) and compiled by OpenVINO for the CPU, in the model's
    dtype: float32, or bfloat16 where the CPU has native bf16 (OpenVINO's precision hint; the export keeps float32
    weights, which OpenVINO rounds as torch's bfloat16 load did). Outputs come back as float32.

    With torch's thread count, and without pinning its threads to cores: on a shared machine a pinned thread waits
    for its core while another is free (the reason the CLI sets OpenMP's waits passive). Each calling thread gets
    its own infer request, the state one forward needs, so two batches never share one. With several ``callers``
    (``--model-workers``), OpenVINO runs as many streams, the threads split between them, so batches run side by
    side, each on its share (docs/models.md has what that gains). OpenVINO fixes the streams
    when it compiles, so a batch that runs alone is split into one part per stream, run side by side (``_Alone``):
    else it would run on one stream's share of the threads while the others idle. More callers than streams queue
    for them."""
    import openvino

    core = openvino.Core()
    precision = "f32"
    if model.dtype == torch.bfloat16:
        if "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            raise ValueError(
                "--runtime openvino runs bfloat16 only on a CPU with native bf16 (avx512_bf16 or amx_bf16), and this"
                " one has none: drop --dtype, or use --runtime torch"
            )
        precision = "bf16"
        model = copy.deepcopy(model).float()  # type: ignore[no-untyped-call]
    streams = min(callers, torch.get_num_threads())
    settings = {
        "INFERENCE_PRECISION_HINT": precision,
        "INFERENCE_NUM_THREADS": torch.get_num_threads(),
        "PERFORMANCE_HINT": "LATENCY" if callers == 1 else "THROUGHPUT",
        "NUM_STREAMS": streams,
        "ENABLE_CPU_PINNING": False,
    }

    def load(path: Path) -> Any:
        return core.compile_model(str(path), "CPU", settings)

    compiled = cached_export(model, output, input_names, root, f"openvino {openvino.__version__}", load)
    fed = [port.get_any_name() for port in compiled.inputs]  # the exporter drops an input the graph never reads
    # One forward now, on the loading thread. OpenVINO's Python binding sets up its numpy bridge at the first tensor
    # it fills, and two threads doing that at once deadlock (seen: two model threads released together, each
    # waiting for what the other holds); it also takes the first call's own set-up out of the first request.
    sample = padded_sample(fed, (2, 1), torch.device("cpu"))
    compiled.create_infer_request().infer({name: tensor.numpy() for name, tensor in sample.items()})
    local = threading.local()
    alone = _Alone()

    def run(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        requests = getattr(local, "requests", None)
        if requests is None:
            requests = local.requests = [compiled.create_infer_request() for _ in range(streams)]
        arrays = {name: inputs[name].numpy() for name in fed}
        rows = len(arrays[fed[0]])
        with alone as by_itself:
            step = -(-rows // streams) if by_itself else rows  # rows per part, rounded up
            if step == rows:
                return torch.from_numpy(requests[0].infer(arrays)[0])  # a copy: the request reuses its buffer
            parts = requests[: -(-rows // step)]
            for index, request in enumerate(parts):
                request.start_async({name: array[index * step : (index + 1) * step] for name, array in arrays.items()})
            for request in parts:
                request.wait()
            return torch.from_numpy(numpy.concatenate([request.get_output_tensor(0).data for request in parts]))

    release = openvino.__version__.split("-")[0]  # "2026.4.1" of "2026.4.1-22982-e213a147257-releases/2026/4"
    logger.info("compiled %s with OpenVINO %s for the CPU in %s", model.name_or_path, release, precision)
    return run


class _Alone:
    """Counts the forwards in flight; entering says whether this one is the only one (then it may take every
    stream). A forward that starts while a split one runs takes one stream and queues in OpenVINO for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    def __enter__(self) -> bool:
        with self._lock:
            self._running += 1
            return self._running == 1

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._running -= 1
