"""Every knob in one place: the CLI fills it from flags and environment variables, tests build it.

A leaf module: importing it loads no torch, so parsing flags stays fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from scorekit.choices import RUNTIMES, Runtime, runtime_error
from scorekit.tracing import PROTOCOLS, TraceProtocol, check_endpoint

ModelKind = Literal[
    "cross-encoder",
    "bi-encoder",
    "causal-lm",
    "llm-reranker",
    "listwise-reranker",
    "sparse-encoder",
    "late-interaction",
    "bge-m3",
]
MODEL_KINDS: tuple[ModelKind, ...] = get_args(ModelKind)

# What an over-long document gets when the request asks nothing: vLLM's 400, or scoring by its best window.
LongDocuments = Literal["error", "chunk"]
LONG_DOCUMENTS: tuple[LongDocuments, ...] = get_args(LongDocuments)

# Where a model's batches run: in the server's process (its worker threads), or in a model host process of its
# own that the server sends token ids to (docs/configuration.md).
ModelHostKind = Literal["thread", "process"]
MODEL_HOSTS: tuple[ModelHostKind, ...] = get_args(ModelHostKind)

# What the embedded default model answers to in `model` fields and /v1/models.
DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine's batching and admission limits (see DESIGN.md section 4)."""

    # Padded tokens (longest x count) per model batch; None: sized for the device at start-up (models/budget.py).
    max_batch_tokens: int | None = None
    max_batch_size: int = 128
    max_queued_items: int = 50_000
    max_concurrent_requests: int = 512
    # Seconds a request may wait in the queue before any of its work runs (then 503); None: no limit.
    max_queue_wait: float | None = None
    # The share of an endless batch's throughput a batch must keep: batches are as short as that allows, by
    # the cost of the batches so far. A batch is never interrupted, so this bounds what a request arriving
    # beside a large one waits (docs/architecture.md); None: batches by tokens and size alone.
    batch_efficiency: float | None = 0.8
    # Items a batch of that budget holds at least (padded to the longest queued one): on a CPU per-item cost is
    # nearly flat beyond ~16 items, and a fit made on a busy machine can ask for fewer than is worth it.
    min_batch_size: int = 16
    # Threads taking batches from the queue and running them on the one model at once, each on its share of the
    # intra-op threads while others run (docs/architecture.md): on a CPU, two batches on one thread each beat
    # one batch on two.
    model_workers: int = 1
    # Requests of at most this many model inputs may also run on a thread of their own that takes nothing larger
    # (the small-job lane): a batch is never interrupted, so without it a small request waits for the batch in
    # flight (docs/architecture.md). 0: no lane.
    small_job_lane: int = 8
    # Seconds of waiting in the queue that raise a request by one priority level (up to the best priority queued),
    # so a request of any priority runs in bounded time (docs/architecture.md).
    priority_aging: float = 1.0

    def __post_init__(self) -> None:
        # An embedding app builds these without the CLI's checks: a zero batch size would kill the worker
        # at the first request, so it is refused here, where the mistake is made.
        optional = ("max_batch_tokens", "max_queue_wait", "batch_efficiency", "small_job_lane", "priority_aging")
        for name in (f.name for f in fields(self) if f.name not in optional):
            _at_least(self, name, 1)
        if self.max_batch_tokens is not None:
            _at_least(self, "max_batch_tokens", 1)
        _at_least(self, "small_job_lane", 0)
        if self.max_queue_wait is not None:
            _seconds(self, "max_queue_wait", zero=False)
        if self.batch_efficiency is not None:
            _share(self, "batch_efficiency")
        _seconds(self, "priority_aging", zero=False)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key and what it may use (a line of ``--api-key-file``, docs/configuration.md): ``name``, what metrics
    call it (the key itself never shows; None: ``key-N``, its place among the server's keys, from 1); ``weight``,
    its share of each model beside the other keys with work queued (weighted fair queuing); and its quotas, in
    requests and in model inputs a minute (None: none)."""

    key: str = field(repr=False)
    name: str | None = None
    weight: float = 1.0
    requests_per_minute: int | None = None
    items_per_minute: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.strip() or self.key != self.key.strip():
            raise ValueError("ApiKey.key must be a key with no blank at either end")
        if self.name is not None and (not self.name.strip() or any(c.isspace() for c in self.name)):
            raise ValueError(f"ApiKey.name must be a name with no blanks, not {self.name!r}")
        weight = self.weight
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 < weight < math.inf:
            raise ValueError(f"ApiKey.weight must be a number more than 0, not {weight!r}")
        for quota in ("requests_per_minute", "items_per_minute"):
            if getattr(self, quota) is not None:
                _at_least(self, quota, 1)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One served model: where its weights are, the name clients send as ``model``, and its engine's limits.
    Each model gets its own engine (batcher, worker thread, limits), so one model's load never queues
    behind another's."""

    path: str | None = None  # a local folder or a hub name; None: the embedded all-MiniLM-L6-v2
    name: str | None = None  # None: the path as given (the embedded model's hub name for it)
    kind: ModelKind | None = None  # None: detected from the model's config
    device: str = "cpu"
    dtype: str = "auto"
    engine: EngineConfig = field(default_factory=EngineConfig)
    max_model_len: int | None = None  # caps the model's own longest input (never raises it); None: the model's
    trust_remote_code: bool = False  # let transformers run the model's own code (architectures it lacks)
    # An LLM reranker's prompt: a preset name or a JSON file; None: reranker_template.json beside the weights,
    # else the preset of the model's type (docs/models.md).
    reranker_template: str | None = None
    runtime: Runtime = "torch"
    # Where --runtime onnx and openvino keep their exports; None: the user's cache (docs/models.md).
    cache_dir: str | None = None
    # "process": the batcher, the worker and the weights run in a model host process; the server tokenizes.
    host: ModelHostKind = "thread"

    def __post_init__(self) -> None:
        _check_kind(self, self.kind)
        _check_runtime(self, self.runtime)
        if self.host not in MODEL_HOSTS:
            raise ValueError(f"ModelSpec.host must be one of {', '.join(MODEL_HOSTS)}, not {self.host!r}")
        if self.max_model_len is not None:
            _at_least(self, "max_model_len", 1)
        if self.name is not None and not self.name.strip():
            raise ValueError("ModelSpec.name must not be empty")
        # What a runtime cannot serve on this device, in this dtype or (when given) of this kind is refused here, so
        # the CLI says so while parsing; a kind detected from the model's config is checked when it loads.
        if (error := runtime_error(self.runtime, kind=self.kind, device=self.device, dtype=self.dtype)) is not None:
            raise ValueError(error)

    @property
    def served_name(self) -> str:
        return self.name or self.path or DEFAULT_MODEL_NAME


@dataclass(frozen=True, slots=True)
class Settings:
    """The server's settings: the models it serves (the first is the default for requests that name none) and
    what applies to the whole server. :meth:`for_model` builds them for one model in one call."""

    models: tuple[ModelSpec, ...] = field(default_factory=lambda: (ModelSpec(),))  # the embedded all-MiniLM-L6-v2
    max_body_bytes: int = 16 << 20
    max_items_per_request: int = 10_000
    shutdown_timeout: float = 30.0
    limit_concurrency: int = 0  # most open connections; 0: derived from the open-file limit (connections.py)
    header_timeout: float = 10.0  # seconds a connection gets to send a complete request head
    long_documents: LongDocuments = "error"  # the default of requests that do not set max_chunks_per_doc
    chunk_overlap: int = 32  # tokens a document's window shares with the one before it
    # Keys a request must bring as `Authorization: Bearer <key>` (the probes stay open); (): no keys asked. An ApiKey
    # also names the key and gives its fair-share weight and quotas; a plain key is ApiKey(key).
    api_keys: tuple[str | ApiKey, ...] = field(default=(), repr=False)  # never in a log line or a failed test's repr
    # CORS, as Starlette's CORSMiddleware takes it; no origins: no CORS middleware (a preflight gets 405).
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    # scorekit's own access line per request (logger "scorekit.access": route, status, duration, model, request id),
    # which `--log-format json` writes in place of uvicorn's (docs/deployment.md).
    access_log: bool = False
    # OpenTelemetry traces (docs/deployment.md): the OTLP collector's URL (None: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
    # no traces), its protocol, grpc or http/protobuf (None: the OTEL_* variables', else grpc), and the service name
    # (None: OTEL_SERVICE_NAME, else scorekit). tracing.TraceConfig.resolve reads them over the variables.
    otlp_traces_endpoint: str | None = None
    otlp_traces_protocol: TraceProtocol | None = None
    otlp_service_name: str | None = None

    def __post_init__(self) -> None:
        if any(not key.strip() for key in self.api_keys if isinstance(key, str)):
            raise ValueError("Settings.api_keys must not hold an empty key")
        keys = self.keys
        for each in ("key", "name"):
            given = [getattr(key, each) for key in keys]
            if len(set(given)) < len(given):
                raise ValueError(f"Settings.api_keys holds one {each} twice")
        _at_least(self, "max_body_bytes", 1)
        _at_least(self, "max_items_per_request", 1)
        _at_least(self, "limit_concurrency", 0)
        _seconds(self, "shutdown_timeout", zero=True)
        _seconds(self, "header_timeout", zero=False)
        if self.long_documents not in LONG_DOCUMENTS:
            raise ValueError(
                f"Settings.long_documents must be one of {', '.join(LONG_DOCUMENTS)}, not {self.long_documents!r}"
            )
        _at_least(self, "chunk_overlap", 0)
        _check_tracing(self)
        models = self.models
        if not isinstance(models, tuple) or not models or not all(isinstance(spec, ModelSpec) for spec in models):
            raise ValueError(f"Settings.models must be a tuple of at least one ModelSpec, not {self.models!r}")
        names = [spec.served_name for spec in self.models]
        if len(set(names)) < len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"Settings.models serves two models under one name: {', '.join(twice)}")

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """``api_keys``, each as an :class:`ApiKey`, named: a plain key, or one with no name, is ``key-N``."""
        keys = (ApiKey(key) if isinstance(key, str) else key for key in self.api_keys)
        return tuple(key if key.name else replace(key, name=f"key-{n}") for n, key in enumerate(keys, 1))

    @classmethod
    def for_model(cls, path: str | None = None, /, **given: Any) -> Settings:
        """One served model: ``path`` and :class:`ModelSpec`'s other fields (``name``, ``kind``, ``device``,
        ``engine``...) by name, with the server's own fields beside them, as in
        ``Settings.for_model("./my-reranker", name="reranker", max_body_bytes=1 << 20)``."""
        if "models" in given:
            raise ValueError("Settings.for_model serves one model: give several as Settings(models=...)")
        spec = {name: given.pop(name) for name in _SPEC_FIELDS if name in given}
        return cls(models=(ModelSpec(path, **spec),), **given)


_SPEC_FIELDS = tuple(spec.name for spec in fields(ModelSpec) if spec.name != "path")


def _at_least(settings: object, name: str, low: int) -> None:
    value = getattr(settings, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{type(settings).__name__}.{name} must be a whole number, at least {low}, not {value!r}")


def _check_kind(settings: object, kind: object) -> None:
    if kind is not None and kind not in MODEL_KINDS:
        name = type(settings).__name__
        raise ValueError(f"{name}.kind must be one of {', '.join(MODEL_KINDS)} or None, not {kind!r}")


def _check_runtime(settings: object, runtime: object) -> None:
    if runtime not in RUNTIMES:
        name = type(settings).__name__
        raise ValueError(f"{name}.runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")


def _check_tracing(settings: Settings) -> None:
    if settings.otlp_traces_endpoint is not None:
        try:
            check_endpoint(settings.otlp_traces_endpoint)
        except ValueError as exc:
            raise ValueError(f"Settings.otlp_traces_endpoint: {exc}") from None
    protocol = settings.otlp_traces_protocol
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"Settings.otlp_traces_protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    if settings.otlp_service_name is not None and not settings.otlp_service_name.strip():
        raise ValueError("Settings.otlp_service_name must not be empty")


def _share(settings: object, name: str) -> None:
    value = getattr(settings, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1:
        raise ValueError(f"{type(settings).__name__}.{name} must be a number between 0 and 1, not {value!r}")


def _seconds(settings: object, name: str, *, zero: bool) -> None:
    value = getattr(settings, name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not zero):
        bound = "0 or more" if zero else "more than 0"
        raise ValueError(f"{type(settings).__name__}.{name} must be a number of seconds, {bound}, not {value!r}")
