"""Where a measurement was taken: host, CPU, device and the software versions that set its
speed (torch, CUDA, NCCL). A calibration file records it (meta), so that a file applied to
another machine, or after an upgrade, can be told apart; and how busy the host was while it
measured (`LoadProbe`: load averages, the CPUs' busy and stolen time from /proc/stat)."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from typing import Any

import torch

from exec.runtime.compat import nccl_version
from exec.runtime.launch import host_cores


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
        # the host the ranks shared (sim.hardware.costs.host scales a run on another by it)
        "cores": host_cores(),
        "threads_per_rank": torch.get_num_threads(),
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


BUSY_LOAD = 1.25  # load average per core above which the host counts as busy
BUSY_STEAL_PCT = 10.0  # so does a hypervisor stealing more than this share of CPU time


def _cpu_times() -> list[int] | None:
    """The first line of /proc/stat (user nice system idle iowait irq softirq steal ...), or
    None where there is none."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        return [int(v) for v in first[1:]]
    except ValueError:
        return None


def _loadavg() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


class LoadProbe:
    """How busy the host is while something is measured: `sample()` between the runs (the
    1-minute load average), `result()` at the end, with the CPUs' busy and stolen share of
    the whole interval from /proc/stat where the OS keeps it (the calibration file's
    `meta.load`, sim.hardware.calibration_schema.HostLoad)."""

    def __init__(self) -> None:
        self.start = _cpu_times()
        self.loads: list[float] = []
        self.sample()

    def sample(self) -> None:
        v = _loadavg()
        if v is not None:
            self.loads.append(v)

    def result(self) -> dict[str, Any]:
        self.sample()
        cores = host_cores()
        out: dict[str, Any] = {"samples": len(self.loads), "cores": cores}
        if self.loads:
            out["loadavg_min"] = round(min(self.loads), 2)
            out["loadavg_max"] = round(max(self.loads), 2)
        end = _cpu_times()
        if self.start is not None and end is not None and len(end) >= 4:
            d = [b - a for a, b in zip(self.start, end)]
            total = sum(d[:8])  # guest time is counted in user already
            if total > 0:
                idle = d[3] + (d[4] if len(d) > 4 else 0)
                out["busy_pct"] = round(min(max(100.0 * (total - idle) / total, 0.0), 100.0), 1)
                if len(d) > 7:
                    out["steal_pct"] = round(min(max(100.0 * d[7] / total, 0.0), 100.0), 2)
        out["busy"] = bool(
            out.get("loadavg_max", 0.0) > BUSY_LOAD * cores
            or out.get("steal_pct", 0.0) > BUSY_STEAL_PCT
        )
        return out
