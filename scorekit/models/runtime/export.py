"""The ONNX export both ONNX runtimes load, made once per model and kept in a cache folder.

The export is torch's TorchScript exporter (``dynamo=False``: the torch.export-based one took longer for MiniLM on a
shared 2-core machine), traced on a padded sample so the attention mask's path is in the graph (transformers drops an
all-ones mask while tracing), with the batch and length dynamic. The file is keyed by what was loaded (a hash of the
config and of every weight and buffer) with the export version and the torch and runtime versions, so an unchanged
checkpoint is reused and a changed one (or an upgraded library) is exported anew.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import PreTrainedModel

from ..base import token_array
from ..padding import padded

logger = logging.getLogger("scorekit.models")

# Bump when what an export holds changes (its inputs, outputs, opset or exporter): older files are then ignored.
EXPORT_VERSION = 1
OPSET = 17
MODEL_FILE = "model.onnx"  # in a folder of its own per export: a model over 2 GB gets its weights in files beside it
T = TypeVar("T")


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


class Output(torch.nn.Module):
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
                Output(model, output, input_names),
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
