"""The sizes of one run: the full benchmark, or the smoke run the test suite uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    """Every knob a scenario reads. Times are seconds; they bound the loops as much as the counts do."""

    name: str
    scorekit_args: tuple[str, ...] = ()  # extra `scorekit serve` flags for the shared server
    docs_per_request: int = 16
    concurrencies: tuple[int, ...] = (1, 8, 32, 64)
    naive_concurrencies: tuple[int, ...] = (1, 8, 32)
    batching_concurrency: int = 32
    warmup_s: float = 1.5
    window_s: float = 8.0
    max_requests: int = 100_000
    sweep_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    sweep_seconds: float = 1.2
    overhead_concurrency: int = 32
    overhead_warmup_s: float = 0.5
    overhead_window_s: float = 3.0
    overhead_rounds: int = 2
    inproc_requests: int = 3000
    inproc_repeats: int = 3
    disconnect_docs: int = 2000
    disconnect_after_batches: int = 3
    disconnect_trials: int = 3
    fairness_big_docs: int = 5000
    fairness_alone_probes: int = 40
    # The quiet key's probes alone in the two-key case, before and after the flood: a p99 wants a few hundred.
    fairness_two_keys_alone_probes: int = 150
    # The two-key case once more with the flood from the probes' own client process, the earlier way, beside it.
    fairness_flood_in_process: bool = True
    fairness_probe_s: float = 15.0
    fairness_big_alone_s: float = 2.0  # the huge request's pace alone is measured over this long
    fairness_small_batch_tokens: int | None = 512
    fairness_probe_cost_s: float = 3.0  # the window a closed loop of probes alone is measured over
    fairness_flood_concurrency: int = 32  # the flooding key's connections in the two-key case
    growth_sizes: tuple[int, ...] = (10, 100, 1000, 10_000)
    fresh_growth_server: bool = True
    llm_prefix_sizes: tuple[int, int] = (16, 128)  # documents of the 1 x N requests the shared prefix is timed on
    llm_raw_batches: tuple[int, ...] = (1, 2, 4, 8)  # requests' prompts per raw forward, the best one counts
    llm_model: tuple[int, int] = (256, 4)  # the random Qwen3 reranker's width and layers


FULL = Profile(name="full")

SMOKE = Profile(
    name="smoke",
    llm_prefix_sizes=(4, 8),
    llm_raw_batches=(1, 2),
    llm_model=(32, 1),
    scorekit_args=("--max-batch-size", "16"),  # short batches: the disconnect and fairness phases end fast
    docs_per_request=4,
    concurrencies=(1, 8),
    naive_concurrencies=(8,),
    batching_concurrency=8,
    warmup_s=0.2,
    window_s=0.8,
    max_requests=20_000,
    sweep_batch_sizes=(1, 8, 16),
    sweep_seconds=0.15,
    overhead_concurrency=8,
    overhead_warmup_s=0.2,
    overhead_window_s=0.4,
    overhead_rounds=1,
    inproc_requests=200,
    inproc_repeats=1,
    disconnect_docs=400,
    disconnect_after_batches=1,
    disconnect_trials=1,
    fairness_big_docs=600,
    fairness_alone_probes=5,
    fairness_two_keys_alone_probes=5,
    fairness_flood_in_process=False,
    fairness_probe_s=2.0,
    fairness_big_alone_s=0.3,
    fairness_small_batch_tokens=None,
    fairness_probe_cost_s=0.3,
    fairness_flood_concurrency=4,
    growth_sizes=(10, 100),
    fresh_growth_server=False,
)
