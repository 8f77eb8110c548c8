"""What the suite's parts share: the run context, timing (CUDA events on a GPU, the host clock
on a CPU), result rows and their CSV, the topology preset of the device (its datasheet peaks,
read from topologies/*.yaml directly) and bounded subprocesses."""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "topologies"

# one row of a kernel part's CSV; every kernel part writes these columns
COLUMNS = [
    "part",
    "name",
    "impl",
    "layout",
    "shape",
    "dtype",
    "flops",
    "bytes",
    "median_s",
    "min_s",
    "max_s",
    "repeats",
    "tflops",
    "gbps",
    "peak_of",
    "peak",
    "peak_share",
    "status",
    "note",
]


class Cut(Exception):
    """A part's time allowance is spent: it stops measuring and keeps what it has."""


@dataclass
class Ctx:
    """One run of the suite, as a part sees it."""

    dry: bool
    out: Path  # the staging folder of the output set (the part writes under it)
    preset: dict[str, Any]  # see device_preset
    device: Any = None  # torch.device, set by the env part
    deadline: float = math.inf  # time.monotonic() by which the current part must end
    shared: dict[str, Any] = field(default_factory=dict)  # results parts pass on
    log: Callable[[str], None] = print

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        if self.left() <= 0:
            raise Cut("its time allowance was spent")


# -- timing ----------------------------------------------------------------------------------
def bench(
    ctx: Ctx, fn: Callable[[], Any], runs: tuple[int, int], setup: Callable[[], Any] | None = None
) -> tuple[float, float, float, int]:
    """(median, min, max, n) seconds of `fn` over `runs` = (warm-ups, repeats): CUDA events
    around each call on a GPU (as the shared H100 script), the host clock after a
    synchronize on a CPU. `setup` runs before each call, outside the timed span."""
    import torch

    ctx.check()
    warm, reps = runs
    cuda = ctx.device is not None and ctx.device.type == "cuda"
    for _ in range(warm):
        if setup:
            setup()
        fn()
    if cuda:
        torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        if setup:
            setup()
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2], ts[0], ts[-1], len(ts)


def sync(ctx: Ctx) -> None:
    import torch

    if ctx.device is not None and ctx.device.type == "cuda":
        torch.cuda.synchronize()


def free(ctx: Ctx) -> None:
    import gc

    import torch

    gc.collect()
    if ctx.device is not None and ctx.device.type == "cuda":
        torch.cuda.empty_cache()


def first_line(e: BaseException | str) -> str:
    text = str(e).strip() or type(e).__name__
    line = text.splitlines()[0].strip()
    return line[:200]


# -- rows ------------------------------------------------------------------------------------
def peak_for(ctx: Ctx, dtype: str | None) -> tuple[str, float | None]:
    """(what the share is of, its value): the dtype's dense peak FLOP/s, or HBM bandwidth."""
    p = ctx.preset
    if dtype is None:
        return "mem_bw", p.get("mem_bw")
    return f"peak_flops.{dtype}", (p.get("peak_flops") or {}).get(dtype)


def row(
    ctx: Ctx,
    part: str,
    name: str,
    *,
    impl: str = "",
    layout: str = "",
    shape: str = "",
    dtype: str = "",
    flops: float = 0.0,
    nbytes: float = 0.0,
    t: tuple[float, float, float, int] | None = None,
    peak: tuple[str, float | None] | None = None,
    status: str = "ok",
    note: str = "",
) -> dict[str, Any]:
    """One result row: achieved TFLOP/s (FLOPs given) or GB/s (bytes given) and the share of
    `peak` (default: the dtype's peak FLOP/s for FLOPs, HBM bandwidth for bytes)."""
    r: dict[str, Any] = {c: "" for c in COLUMNS}
    r.update(part=part, name=name, impl=impl, layout=layout, shape=shape, dtype=dtype)
    r.update(status=status, note=note)
    if flops:
        r["flops"] = flops
    if nbytes:
        r["bytes"] = nbytes
    if t is None:
        return r
    med = t[0]
    r.update(median_s=med, min_s=t[1], max_s=t[2], repeats=t[3])
    if med <= 0:
        return r
    if flops:
        r["tflops"] = flops / med / 1e12
    if nbytes:
        r["gbps"] = nbytes / med / 1e9
    if peak is None:
        peak = peak_for(ctx, dtype if flops else None)
    of, value = peak
    r["peak_of"] = of
    if value:
        r["peak"] = value
        r["peak_share"] = (flops if flops else nbytes) / med / value
    return r


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def csv_text(rows: list[dict[str, Any]], columns: list[str] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _fmt(r.get(k, "")) for k in columns})
    return buf.getvalue()


def write_rows(
    ctx: Ctx, name: str, rows: list[dict[str, Any]], columns: list[str] = COLUMNS
) -> Path:
    path = ctx.out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(csv_text(rows, columns))
    tmp.replace(path)
    return path


def write_text(ctx: Ctx, name: str, text: str) -> Path:
    path = ctx.out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


# -- the device's topology preset ------------------------------------------------------------
def read_yaml(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return doc


def _family(model: str) -> str | None:
    """The GPU's family token in a preset's gpu.model: the first dash-separated part with a
    digit ('H100-SXM5-80GB' -> 'H100', 'GeForce-RTX-4090' -> '4090')."""
    for tok in model.split("-"):
        if re.search(r"\d", tok):
            return tok
    return None


def device_preset(device_name: str, is_cuda: bool, override: str | None = None) -> dict[str, Any]:
    """The topology preset whose gpu.model names the device's family (H100, H200, ...): its
    file, gpu.model, peak_flops, mem_bw, and the PCIe link class a GPU's host copies take.
    Several presets of one family: the shortest file name (dgx-h100 before
    dgx-h100-superpod). A CPU (the dry run) takes localhost-cpu. `override`: a preset name or
    YAML path to use instead."""
    note = ""
    if override:
        path = Path(override)
        if not path.is_file():
            path = TOPOLOGIES / f"{override}.yaml"
        if not path.is_file():
            raise ValueError(f"--preset: no topology preset or file {override!r}")
        note = "named by --preset"
    elif not is_cuda:
        path = TOPOLOGIES / "localhost-cpu.yaml"
        note = "a CPU: the dry run's stand-in preset"
    else:
        found = []
        for f in sorted(TOPOLOGIES.glob("*.yaml")):
            try:
                model = str((read_yaml(f).get("gpu") or {}).get("model", ""))
            except (OSError, ValueError, yaml.YAMLError):
                continue
            fam = _family(model)
            if fam and re.search(rf"(?<![A-Za-z0-9]){re.escape(fam)}(?![0-9])", device_name, re.I):
                found.append((len(f.stem), f.stem, f))
        if not found:
            return {
                "file": None,
                "model": None,
                "peak_flops": {},
                "mem_bw": None,
                "note": f"no preset in topologies/ names {device_name!r}: shares left blank "
                "(give --preset NAME)",
            }
        path = sorted(found)[0][2]
        note = f"matched {device_name!r} by gpu.model family"
    spec = read_yaml(path)
    gpu = spec.get("gpu") or {}
    model = str(gpu.get("model", ""))
    if is_cuda and "pcie" in device_name.lower() and "SXM" in model.upper():
        note += "; the device is a PCIe card, the preset an SXM one: shares are of the SXM peaks"
    pcie = {k: v for k, v in (spec.get("link_classes") or {}).items() if str(k).startswith("pcie")}
    pcie_name = sorted(pcie)[-1] if pcie else None
    return {
        "file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "name": spec.get("name", path.stem),
        "model": model,
        "peak_flops": {str(k): float(v) for k, v in (gpu.get("peak_flops") or {}).items()},
        "mem_bw": float(gpu["mem_bw"]) if gpu.get("mem_bw") else None,
        "sms": gpu.get("sms"),
        "kernels": gpu.get("kernels"),
        "pcie_class": pcie_name,
        "pcie_bw": float(pcie[pcie_name]["bw"]) if pcie_name else None,
        "gpu": gpu,
        "link_classes": spec.get("link_classes") or {},
        "note": note,
    }


# -- subprocesses ----------------------------------------------------------------------------
def child_env(dry: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    env["MOESIM_PROGRESS"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    if dry:  # a busy 2-core machine: idle OpenMP teams must not spin on the other core
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def moesim(*args: str) -> list[str]:
    """A `moesim` command through this interpreter (the CLI's subcommands are stable)."""
    return [sys.executable, "-m", "sim.cli", *args]


def run_cmd(ctx: Ctx, cmd: list[str], log: Path, limit_s: float | None = None) -> tuple[int, str]:
    """Run `cmd` in the repository root, its output appended to `log`, in a process group of
    its own that is ended (SIGTERM, then SIGKILL) if it outlives the part's allowance (or
    `limit_s`); (exit code, its output's last line). 124: it was ended for time."""
    limit = ctx.left() if limit_s is None else min(limit_s, ctx.left())
    if limit <= 0:
        raise Cut("its time allowance was spent")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=child_env(ctx.dry),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            rc = 124
        except BaseException:  # interrupted: the command goes with the suite
            _end_group(proc)
            raise
        f.write(f"[exit {rc} after {time.monotonic() - t0:.1f} s]\n")
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines[:-1]) if not ln.startswith("$ ")), "")
    if rc == 124:
        last = f"ended after {limit:.0f} s (the part's time allowance)"
    return rc, last.strip()[:300]


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's own process group (the launcher ends its ranks), then
    SIGKILL to whatever is left of it."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:  # the group's other members, should any outlive it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            break
        except subprocess.TimeoutExpired:
            continue
