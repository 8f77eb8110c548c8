"""Part `env`: the machine. Device name, compute capability, SMs, memory, L2; driver, clocks
and power from nvidia-smi; torch, CUDA, cuDNN and NCCL versions; the topology preset whose
peaks the other parts' shares are of; whether `sim`'s own dependencies import (the twin and
replay parts need them)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from .common import Ctx, device_preset, write_text

# what `moesim` needs besides torch (pyproject.toml's dependencies), by import name
SIM_DEPS = ("numpy", "pandas", "yaml", "pydantic", "simpy", "networkx", "plotly", "pyarrow", "tqdm")

SMI_FIELDS = (
    "name",
    "driver_version",
    "pci.bus_id",
    "memory.total",
    "clocks.sm",
    "clocks.max.sm",
    "clocks.mem",
    "clocks.max.mem",
    "power.limit",
    "pstate",
    "temperature.gpu",
)


def nvidia_smi() -> dict[str, str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {"error": "nvidia-smi not found"}
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip()[:200]}
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    vals = [v.strip() for v in first.split(",")]
    return dict(zip(SMI_FIELDS, vals))


def missing_sim_deps() -> list[str]:
    return [m for m in SIM_DEPS if importlib.util.find_spec(m) is None]


def run(ctx: Ctx, preset_override: str | None = None) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available() and not ctx.dry
    ctx.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    info: dict[str, Any] = {
        "dry_run": ctx.dry,
        "host": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
    }
    with contextlib.suppress(Exception):  # a version is information, never a failure
        info["cudnn"] = torch.backends.cudnn.version() if cuda else None
    with contextlib.suppress(Exception):
        v = torch.cuda.nccl.version() if cuda else None
        info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    if cuda:
        torch.cuda.set_device(0)
        p = torch.cuda.get_device_properties(0)
        info.update(
            device=torch.cuda.get_device_name(0),
            device_type="cuda",
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            sms=p.multi_processor_count,
            memory_bytes=p.total_memory,
            l2_bytes=getattr(p, "L2_cache_size", None),
            gpus_visible=torch.cuda.device_count(),
            nvidia_smi=nvidia_smi(),
        )
    else:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(
                    (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
                )
        except OSError:
            pass
        info.update(device=f"cpu ({cpu})", device_type="cpu", nvidia_smi=nvidia_smi())
        torch.set_num_threads(1 if ctx.dry else torch.get_num_threads())
    preset = device_preset(info["device"], cuda, preset_override)
    ctx.preset.clear()
    ctx.preset.update(preset)
    info["preset"] = {k: preset.get(k) for k in ("file", "model", "peak_flops", "mem_bw", "note")}
    info["sim_deps_missing"] = missing_sim_deps()
    info["executable"] = sys.executable
    write_text(ctx, "env.json", json.dumps(info, indent=2, default=str) + "\n")
    ctx.shared["env"] = info
    smi = info.get("nvidia_smi") or {}
    clocks = (
        f", SM clock {smi.get('clocks.sm')} (max {smi.get('clocks.max.sm')})"
        if "clocks.sm" in smi
        else ""
    )
    ctx.log(
        f"  device {info['device']}, torch {info['torch']}, CUDA {info['cuda']}, "
        f"NCCL {info['nccl']}{clocks}; preset {preset.get('file')}"
    )
    return {"status": "ran", "device": info["device"]}
