"""What runs a bi-encoder's or cross-encoder's forward: the torch module, its ONNX export in ONNX Runtime
(``--runtime onnx``) or in OpenVINO (``--runtime openvino``), or (``--runtime torchscript``) its TorchScript trace on
the model's own device. Tokenizing, padding, pooling and finishing stay the backend's, and so do the batcher, the
worker, cancellation and metrics: only the call that turns a padded batch into the module's one output changes.

Why both ONNX runtimes: ``python -m bench.runtimes`` ran them on the same ONNX file. On an AMD EPYC without native
bf16, ONNX Runtime ran more items per CPU second than OpenVINO at batch 1 and 32 in float32; on an Intel Xeon with
AMX, OpenVINO ran more in float32, and in bfloat16 (which ONNX Runtime's CPU kernels lack) 1.3-1.4x what torch's own
bfloat16 forward runs at batch 32 and about 3x at batch 1 (docs/models.md). Both are exact to 1e-6 in float32.

The export is torch's TorchScript exporter (``dynamo=False``: 4 to 10 s for MiniLM on a shared 2-core machine,
where the torch.export-based one took 13 s), traced on a padded sample so the attention mask's path is in the graph
(transformers drops an all-ones mask while tracing), with the batch and length dynamic. It runs once per model:
the file is kept in a cache folder, keyed by what was loaded (a hash of the config and of every weight and buffer)
with the export version and the torch and ONNX Runtime versions, so an unchanged checkpoint is reused and a changed
one (or an upgraded library) is exported anew.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy
import torch
from transformers import PreTrainedModel

from scorekit.choices import runtime_missing
from scorekit.settings import Runtime

from .base import token_array
from .loading import padded

logger = logging.getLogger("scorekit.models")

# Bump when what an export holds changes (its inputs, outputs, opset or exporter): older files are then ignored.
EXPORT_VERSION = 1
OPSET = 17
MODEL_FILE = "model.onnx"  # in a folder of its own per export: a model over 2 GB gets its weights in files beside it
# A batch's inputs by name (what loading.pad_batch makes) to the module's one output the backend reads.
Forward = Callable[[dict[str, torch.Tensor]], torch.Tensor]
T = TypeVar("T")


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
            return traced_forward(model, output, input_names)
        if (missing := runtime_missing(self.name)) is not None:
            raise ValueError(missing[0].upper() + missing[1:] + ".")
        if self.name == "openvino":
            return openvino_forward(model, output, input_names, cache_root(self.cache_dir), self.callers)
        return onnx_forward(model, output, input_names, cache_root(self.cache_dir))


TORCH = ModelRuntime()


def cache_root(cache_dir: str | None) -> Path:
    """``cache_dir``, else $XDG_CACHE_HOME/scorekit, else ~/.cache/scorekit."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scorekit"


def cached_export(
    model: PreTrainedModel, output: str, input_names: Sequence[str], root: Path, runtime: str, load: Callable[[Path], T]
) -> T:
    """``load`` of the ONNX file of ``model`` for ``runtime`` (what the key names the runtime by: ONNX Runtime's
    version, as the cache has always been keyed, or "openvino <version>"): exported now, or reused from the cache.

    A cached file the runtime cannot load (damaged on disk after it was written: exports are renamed into place
    only when complete) is exported again, once, with a warning that names it, rather than ending the start."""
    folder = root / "onnx" / export_key(model, output, input_names, runtime)
    path = folder / MODEL_FILE
    if path.exists():
        logger.info("reusing the ONNX export of %s from %s", model.name_or_path, folder)
        try:
            return load(path)
        except Exception as exc:  # each runtime fails in its own words: ONNX Runtime's Fail, OpenVINO's RuntimeError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            logger.warning("the cached export in %s cannot be loaded (%s); exporting it again", folder, first)
            shutil.rmtree(folder, ignore_errors=True)
    started = time.monotonic()
    export(model, output, input_names, folder)
    logger.info("exported %s to ONNX in %.1f s, cached in %s", model.name_or_path, time.monotonic() - started, folder)
    return load(path)


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
    side, each on its share; in bfloat16 on a 2-core Xeon that ran 1.35x the items per CPU second of one stream on
    both threads (16-pair cross-encoder batches, two callers), and in float32 as many. OpenVINO fixes the streams
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


def export_key(model: PreTrainedModel, output: str, input_names: Sequence[str], runtime_version: str) -> str:
    """A hash of what the export depends on: the loaded config and weights, its inputs and output, the versions."""
    digest = hashlib.sha256()
    for part in (EXPORT_VERSION, torch.__version__, runtime_version, type(model).__name__, output, *input_names):
        digest.update(f"{part}\0".encode())
    digest.update(model.config.to_json_string().encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:32]


class _Output(torch.nn.Module):
    """The module with the inputs as plain arguments and its one output as the result (what the exporter traces)."""

    def __init__(self, model: PreTrainedModel, output: str, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.output, self.input_names = model, output, tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(**dict(zip(self.input_names, inputs, strict=True)))[self.output]


def padded_sample(input_names: Sequence[str], lengths: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch of one row per length, right-padded to the longest as a served batch is (``padded``): the attention
    mask's path stays in a trace (transformers drops an all-ones mask while tracing)."""
    ids, mask = padded([token_array([1] * n) for n in lengths], 0)
    sample = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return {name: sample[name].to(device) for name in input_names}


def traced_forward(model: PreTrainedModel, output: str, input_names: Sequence[str]) -> Forward:
    """``model`` traced with TorchScript on its own device and dtype, checked against the module at another shape.

    Why: an eager forward gives the interpreter lock up around each of its hundreds of operators and must win it
    back every time; beside a busy event loop each win can wait the switch interval, which on a GPU (where a
    launch takes microseconds) dwarfs the forward (``python -m bench.gil``). The trace runs its graph in C++ and
    gives the lock up a few times per call. A trace records one path through the module's Python: a model whose
    output would differ at another batch size or length is refused here rather than served wrong.
    """
    started = time.monotonic()
    wrapped = _Output(model, output, input_names)
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


def export(model: PreTrainedModel, output: str, input_names: Sequence[str], folder: Path) -> None:
    """Export to ``folder``/model.onnx through a temporary folder beside it, renamed when complete: a concurrent
    load never reads half an export, and of two processes exporting the same model, the first rename wins."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.", suffix=".part"))
    sample = padded_sample(input_names, (8, 5), torch.device("cpu"))
    axes = {name: {0: "batch", 1: "length"} for name in (*input_names, output)}
    try:
        # The exporter's own warnings (its deprecation, the tracer's notes on transformers' Python branches) say
        # nothing an operator can act on; the exactness test is what checks the graph.
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Output(model, output, input_names),
                tuple(sample.values()),
                str(scratch / MODEL_FILE),
                input_names=list(input_names),
                output_names=[output],
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
        try:
            scratch.rename(folder)
        except OSError:  # another process renamed the same export into place first
            if not (folder / MODEL_FILE).exists():
                raise
    finally:
        model.eval()  # type: ignore[no-untyped-call]  # the exporter leaves the module in training mode
        shutil.rmtree(scratch, ignore_errors=True)
