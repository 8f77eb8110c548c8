"""Where a measurement was taken: host, CPU, device and the software versions that set its
speed (torch, CUDA, NCCL). A calibration file records it (meta), so that a file applied to
another machine, or after an upgrade, can be told apart."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from typing import Any

import torch

from exec.runtime.compat import nccl_version


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        "nccl": nccl_version(),
        "device_type": device.type,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(
            device_name=p.name,
            capability=f"{p.major}.{p.minor}",
            sms=p.multi_processor_count,
            memory_bytes=int(p.total_memory),
        )
    else:
        env["device_name"] = f"cpu ({env['cpu']})"
    return env
