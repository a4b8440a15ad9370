"""GPU: on a machine with CUDA, the server's items per second over the raw fp16 forward's at concurrency 32, for
the embedded MiniLM (``bench.gpu``'s measurement with the full run's window). ``python -m bench`` runs it only
where ``torch.cuda.is_available()``; ``python -m bench.gpu`` measures more models and server flags."""

from __future__ import annotations

from typing import Any

from bench.context import Context
from bench.gpu import TARGET_CONCURRENCY, Run, measure

BATCH_SIZES = (16, 32, 64, 128, 256, 512)


def run(ctx: Context, device: str = "cuda", dtype: str = "float16") -> dict[str, Any]:
    p = ctx.profile
    run = Run(
        device=device,
        dtype=dtype,
        batch_sizes=BATCH_SIZES if p.name == "full" else p.sweep_batch_sizes,
        seconds=p.sweep_seconds,
        window=p.window_s,
        concurrencies=[TARGET_CONCURRENCY],
    )
    result = measure("minilm", run, {"defaults": []}, ctx.work, lambda text: None)
    [point] = result["variants"]["defaults"]["points"]
    return {**result, "device": device, "dtype": dtype, "ratio": point["ratio"]}
