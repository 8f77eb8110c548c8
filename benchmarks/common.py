"""What the benchmarks share: the description of the machine they ran on, recorded with their
results (`benchmarks/results/NAME.{json,md}`).

Import as `benchmarks.common` with the repository root on sys.path (the scripts put it there).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo; elsewhere what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(cores: str = "cores") -> str:
    """'MODEL, N cores, Python X.Y.Z'; `cores` is the word for the CPUs (the recorded
    results of some benchmarks say "CPUs": they keep their wording)."""
    return f"{cpu_model()}, {os.cpu_count()} {cores}, Python {platform.python_version()}"


RESULTS = Path(__file__).resolve().parent / "results"


def device_tag(device: str) -> str:
    """A results-file suffix for a device name, its model's first word: 'NVIDIA H200' -> 'h200',
    'NVIDIA H100 80GB HBM3' -> 'h100'."""
    import re

    words = re.sub(r"^nvidia\s+", "", device.strip().lower()).split()
    return re.sub(r"[^a-z0-9]+", "-", words[0]).strip("-") if words else "device"


def record(name: str, data: dict, lines: list[str]) -> None:
    """Write `results/NAME.json` (the data) and `results/NAME.md` (the lines), each replaced
    atomically, and print the markdown."""
    import json

    from sim.core.io import atomic_write_text

    RESULTS.mkdir(exist_ok=True)
    atomic_write_text(RESULTS / f"{name}.json", json.dumps(data, indent=1) + "\n")
    atomic_write_text(RESULTS / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
