"""The precision CPU training runs in (train.cpu_precision): "fp32", "bf16" autocast, or "auto".

"auto" asks torch which instructions this CPU has: bf16 autocast pays only where matmuls run natively
in bf16 (AVX512-BF16 or AMX); elsewhere oneDNN emulates them and bf16 is slower than fp32.
"""

from __future__ import annotations

import torch


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16)."""
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def cpu_autocast(precision: str) -> bool:
    """Whether CPU training under train.cpu_precision `precision` runs in bf16 autocast."""
    return precision == "bf16" or (precision == "auto" and native_bf16())
