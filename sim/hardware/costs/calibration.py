"""Calibration: fit cost-model parameters to measurements, and the file that carries them.

Measurements are rows (a pandas DataFrame) with columns:
  op       gemm, elementwise, d2h, h2d, all_to_all, all_gather, ... (a task kind)
  ranks    group size for collectives (1 for local work)
  x        work: m*n*k for GEMMs, bytes otherwise (bytes per rank for collectives)
  t        seconds, one measured repetition
  stream   compute, comm or copy: which stream kind ran the op
  others   '+'-joined stream kinds that ran concurrently ('' when alone)

Fits:
- per op kind (and per group size for collectives), t = alpha + beta * x by least squares
  (relative residuals) on the median time per size of the rows measured alone (PipeMoE Eq. 13
  / 16), constrained to alpha, beta >= 0;
- interference (MPipeMoE Sec. II-C, Fig. 3): for each stream kind and set of concurrent
  kinds, the relative speed = median(predicted alone time / measured time), capped at 1;
- GEMMs measured at exact (batch, m, n, k) shapes (a `shape` column): their median time;
- jitter (sim.hardware.costs.jitter): per op kind, quantiles of time / median over the repetitions
  of each size;
- dispatch latency (sim.hardware.costs.dispatch), from `gaps`
  (exec.measure.timings.dispatch_gaps): the mean same-stream and cross-stream wait between
  ready and start.

A calibration file is YAML; `CostModel.build(topo, {"calibration": FILE})` (and `moesim
simulate --calibration FILE`) lays it under the config's explicit costs: compute becomes
alpha-beta with the fitted kinds and profiled shapes, collectives are costed at collective
level with the fitted alpha/beta, and interference, jitter and dispatch latency are replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sim.core.errors import ConfigError, yaml_problem
from sim.core.io import atomic_write_text
from sim.core.kinds import COMM_KINDS
from sim.hardware.costs.jitter import ratio_quantiles

COLUMNS = ("op", "ranks", "x", "t", "stream", "others")


def fit_alpha_beta(x: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """Least-squares t = alpha + beta * x with alpha, beta >= 0; returns (alpha, beta, r2).

    The residuals are relative ((fit - t) / t): sizes span decades and timing noise scales
    with the time, so plain least squares would let the largest size set alpha and miss the
    small operations (a pipeline's chunks) by tens of percent.
    """
    x, t = np.asarray(x, dtype=float), np.asarray(t, dtype=float)
    if len(x) == 0:
        raise ConfigError("calibration: no measurements to fit")
    w = 1.0 / t if (t > 0).all() else np.ones_like(t)
    w2 = w * w
    if len(np.unique(x)) < 2:  # one size says nothing about the slope: a constant cost
        return max(float((w2 * t).sum() / w2.sum()), 0.0), 0.0, 1.0
    candidates = []
    A = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    if a >= 0 and b >= 0:
        candidates.append((float(a), float(b)))
    # boundary solutions of the constrained problem: through the origin, or constant
    xx = float((w2 * x * x).sum())
    if xx > 0:
        candidates.append((0.0, max(float((w2 * x * t).sum()) / xx, 0.0)))
    candidates.append((max(float((w2 * t).sum() / w2.sum()), 0.0), 0.0))

    def sse(p: tuple[float, float], weights: np.ndarray = w2) -> float:
        return float((weights * (p[0] + p[1] * x - t) ** 2).sum())

    a, b = min(candidates, key=sse)
    total = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - sse((a, b), np.ones_like(t)) / total if total > 0 else 1.0
    return float(a), float(b), float(r2)


@dataclass
class Calibration:
    compute: dict[str, dict[str, float]] = field(default_factory=dict)
    collectives: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    interference: dict[str, dict[str, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    dispatch: dict[str, dict[str, float]] = field(default_factory=dict)
    gemm_shapes: list[dict[str, Any]] = field(default_factory=list)
    jitter: dict[str, list[float]] = field(default_factory=dict)

    # -- fitting ---------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        rows: pd.DataFrame,
        meta: dict[str, Any] | None = None,
        gaps: pd.DataFrame | None = None,
    ) -> Calibration:
        """`gaps` (exec.measure.timings.dispatch_gaps: via, gap) gives the dispatch latencies."""
        missing = set(COLUMNS) - set(rows.columns)
        if missing:
            raise ConfigError(f"calibration: measurements lack column(s) {sorted(missing)}")
        rows = rows.assign(others=rows["others"].fillna("").astype(str))
        # one point per size, the median of its repetitions: timings on a shared machine
        # have heavy tails (a descheduled thread), which least squares would chase
        alone = (
            rows[rows["others"] == ""].groupby(["op", "ranks", "x"], as_index=False)["t"].median()
        )
        cal = cls(meta=dict(meta or {}))
        for op, sub in alone.groupby("op"):
            if op in COMM_KINDS:
                fits = []
                for ranks, g in sub.groupby("ranks"):
                    a, b, r2 = fit_alpha_beta(g["x"].to_numpy(), g["t"].to_numpy())
                    fits.append({"ranks": int(ranks), "alpha": a, "beta": b, "r2": r2, "n": len(g)})
                cal.collectives[str(op)] = fits
            else:
                a, b, r2 = fit_alpha_beta(sub["x"].to_numpy(), sub["t"].to_numpy())
                cal.compute[str(op)] = {"alpha": a, "beta": b, "r2": r2, "sizes": len(sub)}
        # interference: only ops that also ran alone have a baseline to compare with
        fitted = set(cal.compute) | set(cal.collectives)
        busy = rows[(rows["others"] != "") & rows["op"].isin(fitted)]
        for (stream, others), g in busy.groupby(["stream", "others"]):
            pred = np.array([cal.predict(r.op, int(r.ranks), float(r.x)) for r in g.itertuples()])
            speed = float(np.median(pred / g["t"].to_numpy()))
            key = "+".join(sorted(str(others).split("+")))
            cal.interference.setdefault(str(stream), {})[key] = float(min(max(speed, 1e-3), 1.0))
        # run-to-run noise per op kind: the spread of repetitions of one size (costs.jitter)
        solo = rows[rows["others"] == ""]
        for op, g in solo.groupby("op"):
            key = g["ranks"].astype(str) + "/" + g["x"].astype(str)
            q = ratio_quantiles(g["t"].to_numpy(dtype=float), key.to_numpy())
            if q is not None:
                cal.jitter[str(op)] = q
        if "shape" in rows.columns:  # GEMMs profiled at exact shapes: their median, alone
            gemms = rows[(rows["op"] == "gemm") & (rows["others"] == "")]
            gemms = gemms[gemms["shape"].fillna("").astype(str) != ""]
            for shape, g in gemms.groupby("shape"):
                b, m, n, k = (int(v) for v in str(shape).split(","))
                cal.gemm_shapes.append(
                    {"batch": b, "m": m, "n": n, "k": k, "seconds": float(g["t"].median())}
                )
        if gaps is not None:
            for via, g in gaps.groupby("via"):
                # the mean, not the median: a makespan adds up every gap, the slow ones too
                cal.dispatch[str(via)] = {
                    "mean": float(g["gap"].mean()),
                    "median": float(g["gap"].median()),
                    "n": len(g),
                }
        return cal

    def predict(self, op: str, ranks: int, x: float) -> float:
        if op in self.compute:
            p = self.compute[op]
            return p["alpha"] + p["beta"] * x
        fits = self.collectives.get(op)
        if not fits:
            raise ConfigError(f"calibration: no fit for {op!r}")
        best = min(fits, key=lambda f: abs(f["ranks"] - ranks))
        return best["alpha"] + best["beta"] * x

    # -- the file ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "compute": self.compute,
            "collectives": self.collectives,
            "interference": self.interference,
            "dispatch": self.dispatch,
            "gemm_shapes": self.gemm_shapes,
            "jitter": self.jitter,
        }

    def save(self, path: str | Path) -> Path:
        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        p = Path(path)
        try:
            raw = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"calibration file {p}: not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"calibration file {p}: not valid YAML ({yaml_problem(e)})") from None
        if not isinstance(raw, dict) or not (raw.get("compute") or raw.get("collectives")):
            raise ConfigError(f"calibration file {p}: expected 'compute' and/or 'collectives'")
        return cls(
            raw.get("compute") or {},
            raw.get("collectives") or {},
            raw.get("interference") or {},
            raw.get("meta") or {},
            raw.get("dispatch") or {},
            raw.get("gemm_shapes") or [],
            raw.get("jitter") or {},
        )

    def cost_spec(self) -> dict[str, Any]:
        """The `costs:` overlay this calibration stands for (see CostModel.build)."""
        spec: dict[str, Any] = {}
        if self.compute:
            spec["compute"] = "alpha_beta"
            spec["alpha_beta"] = {
                k: {"alpha": v["alpha"], "beta": v["beta"]} for k, v in self.compute.items()
            }
        if self.collectives:
            spec["network"] = "collective"
            spec["collectives"] = {
                k: [{"ranks": f["ranks"], "alpha": f["alpha"], "beta": f["beta"]} for f in v]
                for k, v in self.collectives.items()
            }
        if self.interference:
            spec["interference"] = self.interference
        if self.gemm_shapes:
            spec["gemm_shapes"] = self.gemm_shapes
        if self.jitter:
            spec["jitter"] = {"quantiles": self.jitter}
        if self.dispatch:
            spec["dispatch"] = {k: v["mean"] for k, v in self.dispatch.items()}
        return spec
