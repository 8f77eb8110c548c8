"""Calibration: fit cost-model parameters to measurements, and the file that carries them.

Measurements are rows (a pandas DataFrame) with columns:
  op       gemm, elementwise, d2h, h2d, all_to_all, all_gather, ... (a task kind)
  ranks    group size for collectives (1 for local work)
  x        work: m*n*k for GEMMs, bytes otherwise (bytes per rank for collectives)
  t        seconds, one measured repetition
  stream   compute, comm or copy: which stream kind ran the op
  others   '+'-joined stream kinds that ran concurrently ('' when alone)
and optionally `dtype` (what the op ran in), `shape` ('batch,m,n,k' of a GEMM) and `layout`.

Fits:
Every estimate is one a busy host cannot inflate (sim.hardware.costs.robust): a repetition
counts only when it is quiet (within 2x of the fastest of its size), and how many were is
recorded (`quiet`) and flagged below half.

- per op kind (GEMMs per dtype: a bf16 GEMM runs ~15x faster than an fp32 one on an H100), and
  per group size for collectives, t = alpha + beta * x by least squares (relative residuals) on
  the median of the quiet repetitions per size of the rows measured alone (PipeMoE Eq. 13 /
  16), constrained to alpha, beta >= 0, a size disturbed in every repetition (4x above the fit
  through the others) left out, with its quality (r2, mean relative error); a poor fit is a
  warning that names the op. Collectives of one rank are a local copy, not a network cost:
  not fitted;
- interference (MPipeMoE Sec. II-C, Fig. 3): for each stream kind and set of concurrent
  kinds, the relative speed = 1 / median(measured time / predicted alone time) over the quiet
  rows, capped at 1 (a factor below SPEED_FLOOR is a measuring accident: dropped, with a
  warning); nothing involving communication when no collective spanned two ranks;
- GEMMs measured at exact (batch, m, n, k, dtype, layout) shapes: the median time of their
  quiet repetitions;
- jitter (sim.hardware.costs.jitter): per op kind, quantiles of time / quiet median over the
  quiet repetitions of each size (at least 6 of them, else none and a warning);
- dispatch latency (sim.hardware.costs.dispatch), from `gaps`
  (exec.measure.timings.dispatch_gaps): the mean same-stream and cross-stream wait between
  ready and start, over the quiet gaps.
- host launch cost per task kind (sim.hardware.costs.launch), from `issues` (a GPU
  executor's host seconds per issued task, exec.runtime.runner): the mean over the quiet
  ones, as for the dispatch gaps.

Rows with a time that is not a positive number (a collective whose whole duration was waiting
for a peer) are left out, and counted in a warning.

The file (sim.hardware.costs.calibration_file) is checked before it is written and when it is
read, by the same rules, so a file moesim writes is one it reads. `CostModel.build(topo,
{"calibration": FILE})` (and `moesim simulate --calibration FILE`) lays it under the config's
explicit costs: compute becomes alpha-beta with the fitted kinds and profiled shapes,
collectives are costed at collective level with the fitted alpha/beta, and interference,
jitter, dispatch latency and launch costs are replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sim.core.errors import ConfigError
from sim.core.io import atomic_write_text
from sim.core.kinds import COMM_KINDS
from sim.hardware.costs.calibration_file import (
    FORMAT,
    SPEED_FLOOR,
    check,
    clip_to_range,
    cost_spec,
    is_fit,
    read,
)
from sim.hardware.costs.launch import fit_launch
from sim.hardware.costs.robust import (
    LEFT_OUT,
    MIN_JITTER_SAMPLES,
    MIN_QUIET,
    QUIET,
    busy_warning,
    describe_load,
    fit_alpha_beta,
    fit_quiet,
    quiet_gaps,
    quiet_ratios,
    quiet_speed,
)

COLUMNS = ("op", "ranks", "x", "t", "stream", "others")
PER_DTYPE_OPS = frozenset({"gemm"})  # memory-bound stand-ins and copies move bytes, any dtype
POOR_R2 = 0.9  # a fit below this, or off by more than POOR_ERROR on average, is a warning
POOR_ERROR = 0.2


@dataclass
class Calibration:
    compute: dict[str, dict[str, Any]] = field(default_factory=dict)
    collectives: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    interference: dict[str, dict[str, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    dispatch: dict[str, dict[str, float]] = field(default_factory=dict)
    launch: dict[str, dict[str, float]] = field(default_factory=dict)  # host s per task kind
    gemm_shapes: list[dict[str, Any]] = field(default_factory=list)
    jitter: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    # -- fitting ---------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        rows: pd.DataFrame,
        meta: dict[str, Any] | None = None,
        gaps: pd.DataFrame | None = None,
        local_collectives: bool = False,
        issues: pd.DataFrame | None = None,
    ) -> Calibration:
        """`gaps` (exec.measure.timings.dispatch_gaps: via, gap) gives the dispatch latencies;
        `local_collectives` also fits one-rank collectives (only to size other measurements);
        `issues` (op, issue: host seconds per issued task) the launch costs per kind."""
        missing = set(COLUMNS) - set(rows.columns)
        if missing:
            raise ConfigError(f"calibration: measurements lack column(s) {sorted(missing)}")
        cal = cls(meta=dict(meta or {}))
        busy = busy_warning(cal.meta.get("load"))
        cal.warnings += [busy] if busy else []
        rows = rows.reset_index(drop=True)
        t = pd.to_numeric(rows["t"], errors="coerce")
        good = np.isfinite(t) & (t > 0)
        if not good.all():
            cal.warnings.append(
                f"{int((~good).sum())} of {len(rows)} measurements had no positive time "
                f"(a collective that only waited for its peers) and were left out"
            )
        rows = rows[good].assign(others=rows["others"].fillna("").astype(str))
        if "dtype" not in rows.columns:
            rows = rows.assign(dtype="")
        rows = rows.assign(dtype=rows["dtype"].fillna("").astype(str))
        if not local_collectives:
            local = rows["op"].isin(COMM_KINDS) & (rows["ranks"] < 2)
            if local.any():
                cal.meta["local_collectives_not_fitted"] = sorted(set(rows.loc[local, "op"]))
            rows = rows[~local]
        # one point per size, from its quiet repetitions (sim.hardware.costs.robust): timings
        # on a shared machine have heavy tails (a descheduled thread, a CPU hog), which least
        # squares would chase and a median of mostly disturbed repetitions would follow
        solo = rows[rows["others"] == ""]
        for op, sub in solo.groupby("op"):
            op = str(op)
            if op in COMM_KINDS:
                fits = []
                for ranks, g in sub.groupby("ranks"):
                    f = fit_quiet(g, fit_alpha_beta)
                    cal._judge(f"{op} ({int(ranks)} ranks)", f)
                    fits.append({"ranks": int(ranks), **f, "n": f.pop("sizes")})
                cal.collectives[op] = fits
            elif op in PER_DTYPE_OPS and (sub["dtype"] != "").all():
                cal.compute[op] = {}
                for dt, g in sub.groupby("dtype"):
                    cal.compute[op][str(dt)] = f = fit_quiet(g, fit_alpha_beta)
                    cal._judge(f"{op} ({dt})", f)
            else:
                cal.compute[op] = f = fit_quiet(sub, fit_alpha_beta)
                cal._judge(op, f)
        cal._fit_interference(rows)
        # run-to-run noise per op kind: the spread of the quiet repetitions of one size around
        # their median (costs.jitter), never how busy the host was
        for op, g in solo.groupby("op"):
            key = g["ranks"].astype(str) + "/" + g["x"].astype(str) + "/" + g["dtype"]
            r = quiet_ratios(g["t"].to_numpy(dtype=float), key.to_numpy())
            if len(r) >= MIN_JITTER_SAMPLES:
                cal.jitter[str(op)] = [float(v) for v in np.quantile(r, np.linspace(0, 1, 41))]
            elif (g.groupby(key)["t"].size() >= 2).any():
                cal.warnings.append(
                    f"jitter of {op}: {len(r)} quiet repetitions, fewer than "
                    f"{MIN_JITTER_SAMPLES}; not fitted (calibrate again on an idle host)"
                )
        if "shape" in rows.columns:  # GEMMs profiled at exact shapes: their median, alone
            cal._fit_shapes(solo)
        if gaps is not None:
            for via, g in gaps.groupby("via"):
                # the mean, not the median: a makespan adds up every gap, the slow ones too;
                # but only the quiet ones (robust.quiet_gaps): a busy host's are its own
                q = quiet_gaps(g["gap"].to_numpy(dtype=float))
                cal.dispatch[str(via)] = {
                    "mean": float(q.mean()),
                    "median": float(np.median(q)),
                    "n": len(q),
                }
        if issues is not None:
            cal.launch = fit_launch(issues)
        return cal

    def _judge(self, what: str, f: dict[str, Any]) -> None:
        out = f.pop("left_out", 0)
        if out:
            self.warnings.append(
                f"{what}: {out} size(s) disturbed in every repetition (over {LEFT_OUT:g}x the fit "
                f"through the others) left out of its fit"
            )
        if f.get("quiet", 1.0) < MIN_QUIET:
            self.warnings.append(
                f"{what}: only {100 * f['quiet']:.0f}% of its repetitions were quiet (within "
                f"{QUIET:g}x of their size's fastest): the host was busy; the fit rests on the "
                f"quiet ones, calibrate again on an idle host to trust it"
            )
        if f["r2"] < POOR_R2 or f["mean_error"] > POOR_ERROR:
            self.warnings.append(
                f"poor fit for {what}: r2 {f['r2']:.2f}, mean error {100 * f['mean_error']:.0f}% "
                f"over its sizes (a busy machine? calibrate again when it is idle)"
            )

    def _fit_interference(self, rows: pd.DataFrame) -> None:
        # only ops that also ran alone have a baseline to compare with; without a collective
        # over two ranks there is no communication to speak of (one rank's is a local copy)
        networked = bool(self.collectives)
        busy = rows[rows["others"] != ""]
        for (stream, others), g in busy.groupby(["stream", "others"]):
            key = "+".join(sorted(str(others).split("+")))
            if not networked and (stream == "comm" or "comm" in key.split("+")):
                continue
            pred = []
            for r in g.itertuples():
                p = self.predict(r.op, int(r.ranks), float(r.x), r.dtype or None, missing=True)
                pred.append(np.nan if p is None else p)
            ratio = np.asarray(pred) / g["t"].to_numpy()
            ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
            if len(ratio) == 0:
                continue
            # the quiet rows only (robust.quiet_speed): a busy host slows some rows further
            speed, share = quiet_speed(ratio)
            if share < MIN_QUIET:
                self.warnings.append(
                    f"interference {stream} beside {key}: only {100 * share:.0f}% of its rows "
                    f"were quiet; the speed rests on those (a busy host?)"
                )
            if speed < SPEED_FLOOR:
                self.warnings.append(
                    f"interference {stream} beside {key}: speed {speed:.3f} is not plausible "
                    f"(its operations ran {1 / speed:.0f}x slower than alone); not written"
                )
                continue
            self.interference.setdefault(str(stream), {})[key] = min(speed, 1.0)

    def _fit_shapes(self, solo: pd.DataFrame) -> None:
        gemms = solo[(solo["op"] == "gemm") & (solo["shape"].fillna("").astype(str) != "")]
        if "layout" not in gemms.columns:
            gemms = gemms.assign(layout="")
        gemms = gemms.assign(layout=gemms["layout"].fillna("").replace("", "nn"))
        for (shape, dt, layout), g in gemms.groupby(["shape", "dtype", "layout"]):
            b, m, n, k = (int(v) for v in str(shape).split(","))
            if min(b, m, n, k) < 1:
                continue  # an empty GEMM (a skewed chunk without tokens) runs no kernel
            row: dict[str, Any] = {"batch": b, "m": m, "n": n, "k": k}
            if dt:
                row["dtype"] = str(dt)
            t = g["t"].to_numpy(dtype=float)
            quiet = t[t <= QUIET * t.min()]  # the median of its quiet repetitions (robust)
            self.gemm_shapes.append(
                {**row, "layout": str(layout), "seconds": float(np.median(quiet))}
            )

    # -- using it ---------------------------------------------------------------------------
    def fit_of(self, op: str, dtype: str | None = None) -> dict[str, Any] | None:
        """The compute fit of `op` for `dtype` (through the file's stand-ins), or None."""
        entry = self.compute.get(op)
        if entry is None or is_fit(entry):
            return entry
        if dtype is None:
            return next(iter(entry.values()), None)
        stand_in = (self.meta.get("stand_ins") or {}).get(dtype, dtype)
        return entry.get(dtype) or entry.get(stand_in)

    def predict(
        self, op: str, ranks: int, x: float, dtype: str | None = None, missing: bool = False
    ) -> float | None:
        p = self.fit_of(op, dtype)
        if p is not None:
            t: float = p["alpha"] + p["beta"] * x
            return t
        fits = self.collectives.get(op)
        if not fits:
            if missing:
                return None
            raise ConfigError(f"calibration: no fit for {op!r}" + (f" ({dtype})" if dtype else ""))
        best = min(fits, key=lambda f: abs(f["ranks"] - ranks))
        return best["alpha"] + best["beta"] * x

    def describe(self) -> list[str]:
        """What `moesim calibrate` prints: every fit with its quality, then the warnings."""
        lines = []

        def fit_line(name: str, p: dict[str, Any], extra: str = "") -> str:
            quiet = p.get("quiet")
            if quiet is not None and quiet < 1:
                extra += f"  quiet {100 * quiet:.0f}%"
            return (
                f"  {name:18s} alpha {p['alpha'] * 1e6:9.2f} us  beta {p['beta']:.3e}  "
                f"r2 {p['r2']:6.3f}  mean error {100 * p.get('mean_error', 0.0):4.0f}%{extra}"
            )

        if isinstance(self.meta.get("load"), dict):
            lines.append(f"  host load          {describe_load(self.meta['load'])}")

        for op, entry in sorted(self.compute.items()):
            if is_fit(entry):
                lines.append(fit_line(op, entry))
            else:
                lines += [fit_line(f"{op} {dt}", f) for dt, f in sorted(entry.items())]
        for op, fits in sorted(self.collectives.items()):
            lines += [fit_line(op, f, f"  ({f['ranks']} ranks)") for f in fits]
        local = self.meta.get("local_collectives_not_fitted")
        if local:
            lines.append(f"  one-rank {', '.join(local)}: a local copy, not fitted as network")
        for kind, row in sorted(self.interference.items()):
            lines.append(
                f"  {kind:18s} speed " + ", ".join(f"{k}: {v:.2f}" for k, v in row.items())
            )
        if self.jitter:
            lines.append(
                "  jitter             p50 / p90 / max of time over its size's median: "
                + ", ".join(
                    f"{op} {q[len(q) // 2]:.2f}/{q[int(0.9 * (len(q) - 1))]:.2f}/{q[-1]:.1f}"
                    for op, q in sorted(self.jitter.items())
                    if op in ("gemm", "elementwise", "all_to_all", "d2h")
                )
            )
        if self.gemm_shapes:
            lines.append(f"  gemm shapes        {len(self.gemm_shapes)} profiled exactly")
        for via, d in sorted(self.dispatch.items()):
            lines.append(
                f"  dispatch {via:9s} mean {d['mean'] * 1e6:8.1f} us  median "
                f"{d['median'] * 1e6:8.1f} us  ({d['n']} gaps)"
            )
        for kind, d in sorted(self.launch.items()):
            lines.append(
                f"  launch {kind:11s} mean {d['mean'] * 1e6:8.1f} us  median "
                f"{d['median'] * 1e6:8.1f} us  ({d['n']} tasks issued)"
            )
        stand = self.meta.get("stand_ins")
        if stand:
            lines.append(
                "  stand-ins          "
                + ", ".join(f"{g} runs as {r}" for g, r in sorted(stand.items()))
                + f" on this {self.meta.get('device_type', 'device')}"
            )
        lines += [f"  WARNING: {w}" for w in self.warnings or self.meta.get("warnings", [])]
        return lines

    # -- the file (checked, upgraded and translated by sim.hardware.costs.calibration_file) ---
    def to_dict(self) -> dict[str, Any]:
        meta = dict(self.meta)
        if self.warnings:
            meta["warnings"] = list(dict.fromkeys([*meta.get("warnings", []), *self.warnings]))
        return {
            "format": FORMAT,
            "meta": meta,
            "compute": self.compute,
            "collectives": self.collectives,
            "interference": self.interference,
            "dispatch": self.dispatch,
            **({"launch": self.launch} if self.launch else {}),
            "gemm_shapes": self.gemm_shapes,
            "jitter": self.jitter,
        }

    def save(self, path: str | Path) -> Path:
        """Write the file, after the checks `load` makes. A number out of the model's range
        (a busy host's) is clipped and named among the warnings (`clip_to_range`); a file
        that still fails the checks is kept beside `path` as `.unchecked.yaml` and the error
        names it, so a measurement is never lost."""
        raw = self.to_dict()
        clipped = clip_to_range(raw)
        if clipped:
            self.warnings += [w for w in clipped if w not in self.warnings]
            meta = raw.setdefault("meta", {})
            meta["warnings"] = list(dict.fromkeys([*meta.get("warnings", []), *clipped]))
        try:
            check(raw, f"calibration to write to {path}")
        except ConfigError as e:
            kept = Path(path).with_suffix(".unchecked.yaml")
            atomic_write_text(kept, yaml.safe_dump(raw, sort_keys=False))
            raise ConfigError(f"{e} (the measurement is kept in {kept})") from None
        atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        raw = read(path)
        meta = dict(raw.get("meta") or {})
        return cls(
            raw.get("compute") or {},
            raw.get("collectives") or {},
            raw.get("interference") or {},
            meta,
            raw.get("dispatch") or {},
            raw.get("launch") or {},
            raw.get("gemm_shapes") or [],
            raw.get("jitter") or {},
        )

    def cost_spec(self) -> dict[str, Any]:
        """The `costs:` overlay this calibration stands for (see CostModel.build)."""
        return cost_spec(self.to_dict())
