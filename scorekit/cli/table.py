"""The flag table: every ``scorekit serve`` flag, its check, its default and its help line.

The defaults are those of the settings classes, so a flag left out and a value left out in code mean the same.
"""

from __future__ import annotations

from scorekit.choices import DTYPES, RUNTIMES
from scorekit.cli.flags import (
    Flag,
    amount,
    device,
    key_file,
    names,
    nonempty,
    otlp_url,
    seconds,
    share,
    switch,
    whole,
    whole_or_auto,
)
from scorekit.deploy.options import RayOptions
from scorekit.load import ROWS as FRONT_ENDS
from scorekit.logs import LOG_FORMATS
from scorekit.settings import LONG_DOCUMENTS, MODEL_HOSTS, MODEL_KINDS, EngineConfig, ModelSpec, Settings
from scorekit.tracing import DEFAULT_SERVICE_NAME
from scorekit.tracing import PROTOCOLS as TRACE_PROTOCOLS

_ENGINE = EngineConfig()
_SPEC = ModelSpec()
_SETTINGS = Settings()
_RAY = RayOptions()
LOG_LEVELS = ("debug", "info", "warning")

FLAGS = (
    Flag(
        "model",
        nonempty,
        None,
        "A local model folder or a hub name (or give it as MODEL); NAME=MODEL serves it as NAME. Repeat it to"
        " serve several models, each with its own batcher and worker; a request's `model` field picks one,"
        " the first when it names none",
        "the embedded MiniLM",
        metavar="[NAME=]MODEL",
        repeat=True,
    ),
    Flag(
        "served-model-name",
        nonempty,
        None,
        "The name clients use in `model` fields (one model only; name several with NAME=MODEL)",
        "the model as given",
        metavar="NAME",
    ),
    Flag("model-kind", str, None, "Override detection (one model only)", "detected from config.json", MODEL_KINDS),
    Flag("host", nonempty, "127.0.0.1", "Interface to bind", metavar="HOST"),
    Flag("port", whole(1, 65535), 8000, "Port to bind", metavar="PORT"),
    Flag("device", device, _SPEC.device, "torch device: cpu, cuda or cuda:N", metavar="DEVICE"),
    Flag("dtype", str, _SPEC.dtype, "auto is float32 on cpu, float16 on cuda", choices=DTYPES),
    Flag(
        "runtime",
        str,
        _SPEC.runtime,
        "What runs a bi-encoder's or cross-encoder's forward: torch; onnx (ONNX Runtime, the onnx extra; CPU"
        " and float32 only) or openvino (OpenVINO, the openvino extra; CPU, float32 or bfloat16), each exported"
        " once at load and cached; or torchscript (traced at load; on a GPU it gives the interpreter lock up far"
        " less often than torch; docs/models.md)",
        choices=RUNTIMES,
    ),
    Flag(
        "enforce-eager",
        switch,
        False,
        "vLLM's flag, accepted so its command lines carry over: the eager runtime (--runtime torch, which runs no"
        " graph capture or compilation); with another --runtime it is a usage error",
        "off",
    ),
    Flag(
        "model-host",
        str,
        _SPEC.host,
        "Where each model's batches run: thread (in the server's process) or process (the batcher, the worker"
        " and the weights in a model host process of their own; the server tokenizes and sends it token ids, so"
        " the forward never waits on the server's request work; docs/configuration.md)",
        choices=MODEL_HOSTS,
    ),
    Flag(
        "api-processes",
        whole_or_auto(FRONT_ENDS),
        1,
        "Front-end processes sharing the port, each running the whole request path (HTTP, JSON, tokenizing)"
        " against one model host process per model (every model is hosted in a process then); auto: 1 when"
        " every model runs on the CPU, whose cores the forward wants, else a quarter of the cores, from 2 to 8"
        " (docs/configuration.md)",
        metavar="N|auto",
    ),
    Flag(
        "cache-dir",
        nonempty,
        None,
        "Where --runtime onnx and openvino keep their exports",
        "$XDG_CACHE_HOME/scorekit, else ~/.cache/scorekit",
        metavar="DIR",
    ),
    Flag(
        "max-model-len",
        whole(1),
        None,
        "Longest input in tokens, for every model: caps a model's own maximum (more than it is a start-up error)",
        "each model's own",
        metavar="N",
    ),
    Flag(
        "trust-remote-code",
        switch,
        False,
        "Let transformers run a model's own Python code (for architectures it does not ship)",
        "off",
    ),
    Flag(
        "reranker-template",
        nonempty,
        None,
        "An LLM reranker's prompt: a preset (qwen3-reranker, bge-reranker-v2-gemma, mxbai-rerank-v2) or a JSON file"
        " (one model only; docs/models.md)",
        "reranker_template.json beside the weights, else the preset of the model's name or type",
        metavar="PRESET|FILE",
    ),
    Flag(
        "long-documents",
        str,
        _SETTINGS.long_documents,
        "What a document too long to sit beside its query gets when the request sets neither"
        " truncate_prompt_tokens nor max_chunks_per_doc: error (a 400, as vLLM) or chunk (scored by its best"
        " window)",
        choices=LONG_DOCUMENTS,
    ),
    Flag(
        "chunk-overlap",
        whole(0),
        _SETTINGS.chunk_overlap,
        "Tokens a chunked document's window shares with the one before it (at most half a window)",
        metavar="N",
    ),
    Flag(
        "max-batch-tokens",
        whole_or_auto(),
        _ENGINE.max_batch_tokens,
        "Padded tokens (longest x count) per model batch; auto: 16384 on a CPU, and on a GPU what a share of the"
        " memory the model leaves free holds, measured at start-up",
        "auto",
        metavar="N|auto",
    ),
    Flag("max-batch-size", whole(1), _ENGINE.max_batch_size, "Items per model batch", metavar="N"),
    Flag(
        "min-batch-size",
        whole(1),
        _ENGINE.min_batch_size,
        "Items a batch cut by --batch-efficiency holds at least (the batch that carries a new request's first"
        " items may hold fewer)",
        metavar="N",
    ),
    Flag(
        "model-workers",
        whole(1),
        _ENGINE.model_workers,
        "Threads running batches of one model at once, from one queue: on a CPU, 2 runs two batches side by side"
        " on half of torch's intra-op threads each, which beats one batch on all of them (a lone batch still gets"
        " them all); each batch in flight holds its own activations",
        metavar="N",
    ),
    Flag(
        "small-job-lane",
        whole(0),
        _ENGINE.small_job_lane,
        "Requests of at most N model inputs may also run on a thread of their own that takes nothing larger, so a"
        " small request does not wait for a large one's batch to end (0: no lane)",
        metavar="N",
    ),
    Flag(
        "max-queued-items", whole(1), _ENGINE.max_queued_items, "Queued items before new requests get 503", metavar="N"
    ),
    Flag(
        "max-concurrent-requests",
        whole(1),
        _ENGINE.max_concurrent_requests,
        "Requests in flight before 503",
        metavar="N",
    ),
    Flag(
        "max-queue-wait",
        seconds(zero=False),
        _ENGINE.max_queue_wait,
        "Seconds a request may wait in the queue before any of its work runs; past it, 503 with Retry-After"
        " (a request's X-Request-Timeout header may shorten it)",
        "off",
        metavar="SECONDS",
    ),
    Flag(
        "priority-aging",
        seconds(zero=False),
        _ENGINE.priority_aging,
        "Seconds of waiting that raise a queued request by one priority level (vLLM's `priority`: lower runs"
        " earlier), up to the best priority queued, so no request starves",
        metavar="SECONDS",
    ),
    Flag(
        "batch-efficiency",
        share,
        _ENGINE.batch_efficiency,
        "The share of an endless batch's throughput a model batch must keep; batches are as short as that"
        " allows, by the cost of the batches so far (0: by --max-batch-tokens/--max-batch-size alone). A batch"
        " is never interrupted, so this bounds what a small request waits beside a large one",
        metavar="SHARE",
    ),
    Flag("max-body-bytes", whole(1), _SETTINGS.max_body_bytes, "Largest request body (413 above)", metavar="BYTES"),
    Flag(
        "max-items-per-request",
        whole(1),
        _SETTINGS.max_items_per_request,
        "Most documents/items per request",
        metavar="N",
    ),
    Flag(
        "shutdown-timeout",
        seconds(zero=True),
        _SETTINGS.shutdown_timeout,
        "Seconds in-flight requests get on SIGTERM before they are answered 503",
        metavar="SECONDS",
    ),
    Flag(
        "limit-concurrency",
        whole(0),
        _SETTINGS.limit_concurrency,
        "Most open connections; past it the oldest one yet to send a request head is closed. 0: the"
        " open-file limit less a reserve",
        metavar="N",
    ),
    Flag(
        "header-timeout",
        seconds(zero=False),
        _SETTINGS.header_timeout,
        "Seconds a connection gets to send its request head before it is closed",
        metavar="SECONDS",
    ),
    Flag(
        "api-key",
        nonempty,
        None,
        "A key every request but the probes (/health, /healthz, /readyz, /ping, /metrics, /load) must bring as"
        " `Authorization: Bearer KEY`"
        " (401 without it); repeat it for several. Its variable or --api-key-file keep it out of the process list",
        "none, no key asked",
        metavar="KEY",
        repeat=True,
    ),
    Flag(
        "api-key-file",
        key_file,
        None,
        "A file of API keys, one a line (blank lines and # comments skipped), each optionally followed by"
        " name=NAME weight=W requests_per_minute=N items_per_minute=N (its metrics label, fair share and"
        " quotas); they add to --api-key",
        "none",
        metavar="PATH",
    ),
    Flag(
        "allowed-origins",
        names,
        _SETTINGS.allowed_origins,
        "CORS origins, a JSON list or comma-separated (* for any); set, CORS answers as Starlette's"
        " CORSMiddleware does",
        "none, CORS off: a preflight gets 405",
        metavar="ORIGINS",
    ),
    Flag("allowed-methods", names, _SETTINGS.allowed_methods, "CORS methods", "*", metavar="METHODS"),
    Flag("allowed-headers", names, _SETTINGS.allowed_headers, "CORS request headers", "*", metavar="HEADERS"),
    Flag("allow-credentials", switch, _SETTINGS.allow_credentials, "CORS: allow credentials", "off"),
    Flag("log-level", str, "info", "debug logs one line per batch", choices=LOG_LEVELS),
    Flag(
        "log-format",
        str,
        "text",
        "text, or json: one JSON object a line (time, level, logger, message, request_id, route, status, duration,"
        " model), scorekit's access line with them in place of uvicorn's (docs/deployment.md)",
        choices=LOG_FORMATS,
    ),
    Flag(
        "otlp-traces-endpoint",
        otlp_url,
        None,
        "Export a trace of each request (decode, tokenize, queue, batches, encode; a client's traceparent"
        " continued) over OTLP to this collector URL (the otel extra; docs/deployment.md); the OTEL_* variables"
        " configure the exporter, and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT alone turns traces on",
        "off",
        metavar="URL",
        aliases=("otlp-endpoint",),
    ),
    Flag(
        "otlp-traces-protocol",
        str,
        None,
        "OTLP over grpc or http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc",
        choices=TRACE_PROTOCOLS,
    ),
    Flag(
        "otlp-service-name",
        nonempty,
        None,
        "The service.name of the traces",
        f"OTEL_SERVICE_NAME, else {DEFAULT_SERVICE_NAME}",
        metavar="NAME",
    ),
    Flag("debug", switch, False, "Show the traceback of a start-up error, not just its message", "off"),
    Flag(
        "ray",
        switch,
        False,
        "Serve through Ray Serve (pip install 'scorekit[ray]'): replicas of this server behind Ray's HTTP proxy,"
        " which listens on --host and --port; see the Ray Serve flags below",
        "off",
    ),
)

# Only with --ray (docs/deployment.md). Their defaults come from RayOptions; None: sized from the engine limits.
RAY_FLAGS = (
    Flag("replicas", whole(1), _RAY.replicas, "A fixed number of replicas", metavar="N"),
    Flag("min-replicas", whole(0), None, "Autoscale from this many replicas (with --max-replicas)", "1", metavar="N"),
    Flag("max-replicas", whole(1), None, "Autoscale up to this many replicas", "no autoscaling", metavar="N"),
    Flag(
        "target-ongoing-requests",
        whole(1),
        None,
        "Requests in flight per replica that autoscaling aims at",
        "a batch's worth, at most half of --max-ongoing-requests",
        metavar="N",
    ),
    Flag(
        "max-ongoing-requests",
        whole(1),
        None,
        "Requests Ray sends one replica at once; Ray queues the rest",
        "--max-concurrent-requests",
        metavar="N",
    ),
    Flag("num-gpus", amount, _RAY.num_gpus, "GPUs per replica (with --device cuda)", metavar="N"),
    Flag("num-cpus", amount, _RAY.num_cpus, "CPUs per replica", metavar="N"),
    Flag(
        "ray-address",
        nonempty,
        None,
        "The Ray cluster to join (auto: the one `ray start` runs here)",
        "a local Ray instance, started and stopped with the server",
        metavar="ADDRESS",
    ),
    Flag(
        "replica-probe-port",
        whole(1, 65535),
        _RAY.probe_port,
        "Each replica also serves /health, /load and /metrics on --host at this port plus its rank on its node",
        "none",
        metavar="PORT",
    ),
)
