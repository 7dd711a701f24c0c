"""The host a measurement ran on, as a reader comparing figures across hosts needs it (benchmark
results, the quality study's runs)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_description() -> dict[str, object]:
    """What a reader needs to compare figures across hosts: CPU model, usable cores, memory, GPU."""
    memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    gpu = None
    try:
        import torch  # noqa: PLC0415 - only to name the GPU: bench.report and the Spark benchmarks run without it

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": memory_gib,
        "gpu": gpu,
        "python": platform.python_version(),
    }
