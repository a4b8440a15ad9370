"""bfloat16 on the CPU: whether this CPU computes it natively, and the one start-up line that says what
``--dtype bfloat16`` costs or may gain here (a CPU without native bf16 emulates it, slower than float32)."""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger("scorekit.models")

# The instruction sets that compute bf16 natively, as torch.cpu.get_capabilities() names them: x86's AVX-512 BF16
# and AMX BF16, ARM64's BF16 (NEON) and SVE BF16.
NATIVE_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")
# From docs/benchmarks.md ("bf16 on CPU"), not measured at start-up: about how many times float32's CPU time
# MiniLM's forward in bfloat16 took on a CPU without native bf16 (the runs are there).
EMULATED_SLOWDOWN = 5.0
# Likewise: about how much less CPU time the same forward took in bfloat16 on a CPU with AMX (an Intel Xeon with
# amx_bf16 and avx512_bf16). No CPU with avx512_bf16 alone was measured.
AMX_SPEEDUP = 3.0
# And from docs/models.md ("OpenVINO on the CPU"): the items per CPU second OpenVINO's bfloat16 forward ran, against
# torch float32's, on that CPU (--runtime openvino --dtype bfloat16).
OPENVINO_AMX_SPEEDUP = "3.5-5x"


def native_bf16() -> list[str]:
    """This CPU's native bf16 instruction sets (torch reads cpuid once and caches it, on any OS)."""
    capabilities = torch.cpu.get_capabilities()
    return [flag for flag in NATIVE_FLAGS if capabilities.get(flag) is True]


def bf16_line(dtype: torch.dtype, native: list[str]) -> tuple[int, str]:
    """The level and text of the start-up line about bf16 on a CPU that serves ``dtype``: a warning when
    bfloat16 is asked for and the CPU emulates it, a debug line when float32 is served on such a CPU."""
    has = f"this CPU has native bf16 ({', '.join(native)})"
    has_not = "this CPU has no native bf16 (no avx512_bf16 or amx_bf16)"
    error = "scores within the bf16 error of float32 in docs/models.md"
    slower = f"about {EMULATED_SLOWDOWN:.0f}x slower than float32 (docs/benchmarks.md)"
    if dtype == torch.bfloat16 and native:
        return logging.INFO, f"{has}: serving bfloat16, {error}"
    if dtype == torch.bfloat16:
        return logging.WARNING, f"{has_not}: bfloat16 is emulated, {slower}; --dtype float32 is faster and exact"
    if native:
        gain = (
            f"about {AMX_SPEEDUP:.0f}x less CPU per forward with amx_bf16 (docs/benchmarks.md), {OPENVINO_AMX_SPEEDUP}"
            " with --runtime openvino (docs/models.md)"
            if "amx_bf16" in native
            else "no speed figure measured without amx_bf16"
        )
        return logging.INFO, f"{has}: --dtype bfloat16 may run faster ({gain}; {error})"
    # Nothing to act on (float32 is the right choice here), so not in the INFO start-up log.
    return logging.DEBUG, f"{has_not}: --dtype bfloat16 would be emulated, {slower}"


@functools.cache
def log_cpu_bf16(dtype: torch.dtype) -> None:
    """Log the bf16 line once per process and dtype: it is about the CPU, and several models share --dtype."""
    level, text = bf16_line(dtype, native_bf16())
    logger.log(level, text)
