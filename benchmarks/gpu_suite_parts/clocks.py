"""The GPU's clocks while the parts that time long GPU work run (the twin's calibrate,
validate, validate_big and block; the gemm part): SM clock, memory clock, power draw,
temperature, utilisation and the clock-event (throttle) reasons, every PERIOD_S, in
`clocks.csv`, summarised per part in summary.md / summary.json.

Why: the H200's run 3 (reports/gpu-h200-2026-11-27/README.md) timed one GEMM shape at
6.15 ms in the calibration's long back-to-back chain and at 5.33 ms in the validation's short
graphs, most likely clocks held down under sustained power against short bursts; nothing
recorded the clocks. Here NVML (`pynvml`, from nvidia-ml-py) is read in a thread of the
suite; without it `nvidia-smi --query-gpu=... -lms 100` runs in the background (its rows
are timed when their line arrives; no throttle mask). NVML's power on Ampere and newer is its
1 s average, nvidia-smi's `power.draw` likewise on recent drivers. On a CPU
(the dry run), or with neither, nothing is sampled and `why` says so in one line. The
sampler never fails the suite: every error ends the sampling with its reason; each part's
sampling stops when the part ends and at the part's allowance (`Ctx.deadline`) whatever the
part does.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

from .common import Ctx, csv_text, first_line, write_text

SAMPLED = ("calibrate", "validate", "validate_big", "block", "gemm")
PERIOD_S = 0.1
COLUMNS = ["time_s", "part", "sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct", "throttle"]
SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu"
# NVML's clock-event (throttle) reason bits that hold the clocks down under load
REASONS = {
    0x4: "power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "power brake",
}
BUSY_PCT = 50.0  # a sample counts as busy at this GPU utilisation or more


def _num(text: str) -> float | None:
    try:
        v = float(text.strip())
    except (TypeError, ValueError):
        return None
    return v if v == v else None


class Sampler:
    """One per suite run: `start(ctx, part)` before a part in SAMPLED, `stop()` after it
    (always: in a finally), `close()` at the end; `rows` and `why` are the result."""

    def __init__(self, t0: float, period_s: float = PERIOD_S) -> None:
        self.t0 = t0
        self.period_s = period_s
        self.rows: list[dict[str, Any]] = []
        self.why = ""  # why nothing is (or no more is) sampled; "" while all is well
        self.source = ""  # "nvml", or "nvidia-smi (why not NVML)"
        self._nv: Any = None
        self._handle: Any = None
        self._smi: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._timer: threading.Timer | None = None
        self._told = ""

    # -- choosing a source, once -----------------------------------------------------------
    def _open(self, ctx: Ctx) -> bool:
        if self.source:
            return True
        if self.why:
            return False
        if ctx.device is None or ctx.device.type != "cuda":
            self.why = (
                "not sampled: the dry run runs on a CPU, which has no GPU clocks"
                if ctx.dry
                else "not sampled: no CUDA device"
            )
            return False
        errors, nv = [], None
        try:
            nv = importlib.import_module("pynvml")
            nv.nvmlInit()
            self._handle = _nvml_handle(nv)
            self._nv, self.source = nv, "nvml"
            self._read_nvml()  # one read now: a source that cannot read is no source
            return True
        except Exception as e:  # noqa: BLE001 - no NVML: try nvidia-smi
            errors.append(f"NVML: {first_line(e)}")
            self._nv, self.source = None, ""
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()  # type: ignore[union-attr]
        self._smi = shutil.which("nvidia-smi")
        if self._smi:
            self.source = f"nvidia-smi ({errors[0]})"
            return True
        errors.append("no nvidia-smi on PATH")
        self.why = "not sampled: " + "; ".join(errors)
        return False

    # -- one part ----------------------------------------------------------------------------
    def start(self, ctx: Ctx, part: str) -> None:
        try:
            if not self._open(ctx):
                return
            self._stop.clear()
            left = max(ctx.deadline - time.monotonic(), 0.0) if ctx.deadline < 1e18 else 3600.0
            if self.source == "nvml":
                self._thread = threading.Thread(
                    target=self._nvml_loop, args=(part, time.monotonic() + left), daemon=True
                )
                self._thread.start()
            else:
                self._start_smi(part)
                # the part's allowance ends the background process whatever the part does
                self._timer = threading.Timer(left, self._end_proc)
                self._timer.daemon = True
                self._timer.start()
        except Exception as e:  # noqa: BLE001 - sampling never fails the suite
            self._give_up(f"{self.source or 'sampler'}: {first_line(e)}")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._stop.set()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._end_proc()
            if self._thread is not None:
                self._thread.join(timeout=2.0)
                self._thread = None

    def close(self) -> None:
        self.stop()
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None
        if not self.rows and not self.why:
            self.why = f"no samples ({self.source or 'no source'}: none of its parts ran)"

    def news(self) -> str:
        """`why`, the first time it is asked after `why` changed; "" otherwise."""
        if self.why == self._told:
            return ""
        self._told = self.why
        return self.why

    def _give_up(self, why: str) -> None:
        self.why = self.why or f"sampling stopped: {why}"
        self.source = "" if not self.rows else self.source
        self._stop.set()

    def _add(self, part: str, vals: dict[str, Any]) -> None:
        self.rows.append({"time_s": time.monotonic() - self.t0, "part": part, **vals})

    # -- NVML: a thread of the suite -------------------------------------------------------
    def _read_nvml(self) -> dict[str, Any]:
        """One sample; the SM clock must read, the rest is blank where the device has none."""
        nv, h = self._nv, self._handle
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        reads = {
            "mem_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "util_pct": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "throttle": lambda: hex(int(reasons(h))) if reasons else "",
        }
        vals: dict[str, Any] = {"sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)}
        for key, read in reads.items():
            try:
                vals[key] = read()
            except Exception:  # noqa: BLE001 - not supported here: left blank
                vals[key] = ""
        return vals

    def _nvml_loop(self, part: str, until: float) -> None:
        try:
            while not self._stop.is_set() and time.monotonic() < until:
                self._add(part, self._read_nvml())
                self._stop.wait(self.period_s)
        except Exception as e:  # noqa: BLE001
            self._give_up(f"NVML: {first_line(e)}")

    # -- nvidia-smi: a background process ----------------------------------------------------
    def _start_smi(self, part: str) -> None:
        assert self._smi is not None
        ms = str(max(int(self.period_s * 1000), 1))
        cmd = [self._smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
        cmd += ["-i", _cuda_index(), "-lms", ms]
        self._proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self._thread = threading.Thread(target=self._smi_loop, args=(part, self._proc), daemon=True)
        self._thread.start()

    def _smi_loop(self, part: str, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        bad = ""
        for line in proc.stdout:
            vals = [_num(v) for v in line.split(",")]
            if len(vals) != 5 or vals[0] is None:
                bad = bad or line.strip()
                continue
            keys = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct")
            self._add(part, {**dict(zip(keys, vals)), "throttle": ""})
        if bad and not self.rows:
            self._give_up(f"nvidia-smi: {bad[:200]}")

    def _end_proc(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for end, wait in ((proc.terminate, 2.0), (proc.kill, 2.0)):
            with contextlib.suppress(Exception):
                end()
                proc.wait(timeout=wait)
                break


def _cuda_index() -> str:
    """nvidia-smi's index of CUDA device 0: CUDA_VISIBLE_DEVICES' first entry (an index or
    a UUID), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


def _nvml_handle(nv: Any) -> Any:
    """NVML's handle of torch's CUDA device 0, matched by UUID; else by _cuda_index()."""
    with contextlib.suppress(Exception):
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            u = nv.nvmlDeviceGetUUID(h)
            u = (u.decode() if isinstance(u, bytes) else str(u)).lower().removeprefix("gpu-")
            if u and u == uuid:
                return h
    idx = _cuda_index()
    if idx.isdigit():
        return nv.nvmlDeviceGetHandleByIndex(int(idx))
    return nv.nvmlDeviceGetHandleByUUID(idx)


# -- the summary -----------------------------------------------------------------------------
def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per part, in the order the parts first appear: samples, SM clock min / median / max
    (and its median over the busy samples, GPU utilisation >= BUSY_PCT), memory clock
    median, power median and max, temperature max, and the clock-event reasons seen with
    the share of samples each was active in."""

    def vals(rs: list[dict[str, Any]], key: str) -> list[float]:
        return [float(r[key]) for r in rs if r.get(key) not in (None, "")]

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    out: dict[str, dict[str, Any]] = {}
    for part in dict.fromkeys(r["part"] for r in rows):
        rs = [r for r in rows if r["part"] == part]
        sm, pw = vals(rs, "sm_mhz"), vals(rs, "power_w")
        busy = [r for r in rs if (_num(str(r.get("util_pct", ""))) or 0.0) >= BUSY_PCT]
        masks = [int(str(r["throttle"]), 16) for r in rs if r.get("throttle") not in (None, "")]
        reasons = {
            name: sum(1 for m in masks if m & bit) / len(masks)
            for bit, name in REASONS.items()
            if any(m & bit for m in masks)
        }
        out[part] = {
            "samples": len(rs),
            "seconds": rs[-1]["time_s"] - rs[0]["time_s"],
            "sm_mhz_min": min(sm) if sm else None,
            "sm_mhz_median": med(sm),
            "sm_mhz_max": max(sm) if sm else None,
            "sm_mhz_median_busy": med(vals(busy, "sm_mhz")),
            "busy_samples": len(busy),
            "mem_mhz_median": med(vals(rs, "mem_mhz")),
            "power_w_median": med(pw),
            "power_w_max": max(pw) if pw else None,
            "temp_c_max": max(vals(rs, "temp_c"), default=None),
            "reasons": reasons,
        }
    return out


def result(ctx: Ctx, sampler: Sampler) -> dict[str, Any]:
    """Writes clocks.csv (a header only when nothing was sampled) and returns what the
    summary shows: source, period, why nothing was sampled, the per-part summary."""
    res: dict[str, Any] = {"source": sampler.source, "period_s": sampler.period_s, "parts": {}}
    try:
        sampler.close()
        rows = list(sampler.rows)
        res.update(samples=len(rows), note=sampler.why)
        write_text(ctx, "clocks.csv", csv_text(rows, COLUMNS))
        res["parts"] = summarise(rows)
    except Exception as e:  # noqa: BLE001 - the clocks never fail the suite
        res["note"] = f"{res.get('note') or ''} (not summarised: {first_line(e)})".strip()
    return res


def markdown(c: dict[str, Any] | None) -> list[str]:
    if not c:
        return []
    L = ["", "## GPU clocks while the parts ran", ""]
    if c.get("note"):
        L.append(f"- clocks {c['note']}")
    if not c.get("parts"):
        return L
    L += [
        f"- {c['samples']} samples every {c['period_s'] * 1e3:.0f} ms through {c['source']} "
        f"(`clocks.csv`); busy: GPU utilisation >= {BUSY_PCT:.0f}%",
        "",
        "| part | samples | SM MHz min / median / max | SM MHz busy | mem MHz | power W "
        "median (max) | temp C max | clock-event reasons (share of samples) |",
        "|---|---:|---|---:|---:|---|---:|---|",
    ]

    def f(x: Any, fmt: str = ".0f") -> str:
        return "-" if x is None else format(x, fmt)

    for part, s in c["parts"].items():
        why = ", ".join(f"{k} {v:.0%}" for k, v in s["reasons"].items()) or "-"
        L.append(
            f"| {part} | {s['samples']} | {f(s['sm_mhz_min'])} / {f(s['sm_mhz_median'])} / "
            f"{f(s['sm_mhz_max'])} | {f(s['sm_mhz_median_busy'])} | {f(s['mem_mhz_median'])} | "
            f"{f(s['power_w_median'])} ({f(s['power_w_max'])}) | {f(s['temp_c_max'])} | {why} |"
        )
    return L
