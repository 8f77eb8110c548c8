"""The `dgx-h100` GPU model against one measured H100 SXM, without any calibration.

Scores the preset's GEMM model (`gpu.gemm`, sim.hardware.costs.gemm) on the GEMMs of
../shared/reference/measurements/h100-sxm-2026-11-23/ (`h100_micro.csv`: three MoE models'
expert GEMMs in the layouts autograd runs, bf16 / fp16 / fp32 / tf32; `gemm_layout.txt`: the
wgrad GEMM from a view and materialised, and the forward GEMM, at capacities up to 19,661):

- in sample: the rows the model's parameters were fitted to (mixtral, switch-base, tf32);
- held out: the gpt-moe-1.3b rows and every gemm_layout.txt row (fitted to nothing);
- apart: the wgrad GEMMs on a materialised operand whose leading dimension is not a multiple
  of 8 (what the executor ran before it used views; training never runs them): their
  `unaligned_efficiency` comes from a third file, exec_trace_big_layer.csv.

Also checked against the same folder: the preset's copy engine (a 1 GiB pinned d2h / h2d over
the PCIe Gen5 route) and its compute / copy interference (a GEMM beside a d2h runs at full
speed), and, as an aside, the bf16 GEMMs of `exec_trace_big_layer.csv`.

    python benchmarks/gpu_model_h100.py            # score the preset; write the results
    python benchmarks/gpu_model_h100.py --fit      # refit the in-sample parameters (scipy)

Results go to benchmarks/results/gpu_model_h100.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from sim.core.graph import Task, TaskGraph
from sim.core.io import atomic_write_text
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.costs.gemm import GemmModel
from sim.hardware.costs.gemm_reference import load, predict, score
from sim.hardware.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared/reference/measurements/h100-sxm-2026-11-23"
OUT = ROOT / "benchmarks/results"
TARGET_MAPE, TARGET_WORST = 10.0, 25.0


def preset_model() -> GemmModel:
    model = GemmModel.from_gpu(Topology.load("dgx-h100", nodes=1).gpu)
    assert model is not None, "dgx-h100 has no gpu.gemm section"
    return model


def split(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {
        "in_sample": df[~df["held_out"] & df["aligned"]],
        "held_out": df[df["held_out"] & df["aligned"]],
        "unaligned": df[~df["aligned"]],
    }


# -- the fit (in-sample rows only) -----------------------------------------------------------
FITTED = (
    "eff_tc",
    "eff_tf32",
    "eff_fp32",
    "tile_overhead_k",
    "launch_s",
    "read_efficiency",
    "write_efficiency",
    "split_k_s",
)
BOUNDS = [
    (0.5, 1.0),
    (0.4, 1.0),
    (0.4, 1.0),
    (0.0, 256.0),
    (2e-6, 25e-6),
    (0.4, 1.0),
    (0.3, 1.0),
    (0.0, 1e-5),
]


def with_params(base: GemmModel, x: list[float]) -> GemmModel:
    p = dict(zip(FITTED, x))
    eff = {"bf16": p["eff_tc"], "fp16": p["eff_tc"], "tf32": p["eff_tf32"], "fp32": p["eff_fp32"]}
    return replace(
        base,
        efficiency=eff,
        tile_overhead_k=p["tile_overhead_k"],
        launch_s=p["launch_s"],
        read_efficiency=p["read_efficiency"],
        write_efficiency=p["write_efficiency"],
        split_k_s=p["split_k_s"],
        _cache={},
    )


def fit(base: GemmModel, rows: pd.DataFrame) -> GemmModel:
    """Minimise mean + max/2 of |relative error| on `rows` (differential evolution, seeded,
    then Nelder-Mead): the mean alone would let a few shapes drift far off."""
    from scipy.optimize import differential_evolution, minimize  # only for refitting

    def loss(x) -> float:
        e = predict(with_params(base, list(x)), rows)["error"].abs()
        return float(e.mean() + 0.5 * e.max())

    res = differential_evolution(loss, BOUNDS, seed=0, maxiter=150, popsize=12, polish=False)
    res = minimize(loss, res.x, method="Nelder-Mead", options={"maxiter": 1500})
    return with_params(base, list(res.x))


def unaligned_from_exec_trace() -> float | None:
    """Time of the executor's forward / dgrad GEMMs over its materialised (unaligned) wgrad
    ones in exec_trace_big_layer.csv: the same work, so the ratio is the unaligned rate."""
    path = DATA / "exec_trace_big_layer.csv"
    if not path.is_file():
        return None
    t = pd.read_csv(path)
    g = t[t["kind"] == "gemm"]
    wgrad = g[g["id"].str.contains("wgrad")]["measured_s"].median()
    other = g[~g["id"].str.contains("wgrad")]["measured_s"].median()
    return float(other / wgrad)


# -- the copy engine and interference --------------------------------------------------------
def copy_engine() -> dict:
    micro = pd.read_csv(DATA / "h100_micro.csv")
    topo = Topology.load("dgx-h100", nodes=1)
    costs = CostModel.build(topo, {})
    out = {}
    for kind in ("d2h", "h2d"):
        row = micro[(micro["bench"] == f"{kind}_pinned") & (micro["bytes"] == 2**30)].iloc[0]
        g = TaskGraph(8)
        for r in range(8):
            if r == 0:
                g.add(Task(f"c{r}", r, "copy", kind, bytes=float(2**30)))
        sim = simulate(g, topo, costs).makespan
        out[kind] = {
            "measured_s": float(row["t_med_s"]),
            "simulated_s": sim,
            "error_pct": 100 * (sim / float(row["t_med_s"]) - 1),
            "measured_GBps": 2**30 / float(row["t_med_s"]) / 1e9,
        }
    alone = micro[micro["bench"] == "alone_gemm"]["t_med_s"].iloc[0]
    beside = micro[micro["bench"] == "overlap_gemm_with_d2h"]["t_med_s"].iloc[0]
    d2h_alone = micro[micro["bench"] == "alone_d2h"]["t_med_s"].iloc[0]
    d2h_beside = micro[micro["bench"] == "overlap_gemm_with_d2h"]["t_min_s"].iloc[0]
    inter = topo.gpu.get("interference") or {}
    out["interference"] = {
        "gemm_speed_beside_d2h_measured": float(alone / beside),
        "d2h_speed_beside_gemm_measured": float(d2h_alone / d2h_beside),
        "preset_compute_beside_copy": float(inter.get("compute", {}).get("copy", 1.0)),
        "preset_copy_beside_compute": float(inter.get("copy", {}).get("compute", 1.0)),
    }
    return out


def exec_trace_aside(model: GemmModel) -> list[dict]:
    """The executor's bf16 GEMMs of one big layer (B=8, L=2048, M=4096, H=14336, E=2, top-2,
    f=1.2: C = 19,661), measured with small uniform inputs (rand * 0.01)."""
    path = DATA / "exec_trace_big_layer.csv"
    if not path.is_file():
        return []
    c, m, h = 19661, 4096, 14336
    shapes = {
        "fc1": (c, h, m, "nn"),
        "fc2": (c, m, h, "nn"),
        "fc2_dgrad": (c, h, m, "nt"),
        "fc1_dgrad": (c, m, h, "nt"),
    }
    t = pd.read_csv(path)
    out = []
    for r in t[t["kind"] == "gemm"].itertuples():
        step = str(r.id).split("/")[3].split(".")[0]
        if step not in shapes:
            continue  # the materialised wgrads: see unaligned_from_exec_trace
        mm, nn, kk, lay = shapes[step]
        pred = model.seconds("bf16", 2, mm, nn, kk, lay)
        out.append(
            {
                "task": r.id,
                "measured_s": r.measured_s,
                "predicted_s": pred,
                "error_pct": 100 * (pred / r.measured_s - 1),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true", help="refit the in-sample parameters")
    a = ap.parse_args(argv)
    if not (DATA / "h100_micro.csv").is_file():
        print(f"no measurements at {DATA}", file=sys.stderr)
        return 1
    df = load(DATA)
    model = preset_model()
    parts = split(df)
    if a.fit:
        model = fit(model, parts["in_sample"])
        print(
            "fitted:",
            {k: round(v, 4) for k, v in model.efficiency.items()},
            f"tile_overhead_k {model.tile_overhead_k:.1f} launch_s {model.launch_s:.3g} "
            f"read {model.read_efficiency:.3f} write {model.write_efficiency:.3f} "
            f"split_k_s {model.split_k_s:.3g}",
        )
        print("unaligned_efficiency from exec_trace_big_layer.csv:", unaligned_from_exec_trace())
    scored = {k: predict(model, v) for k, v in parts.items()}
    scores = {k: score(v).as_dict() for k, v in scored.items()}
    result = {
        "data": str(DATA.relative_to(ROOT.parent)),
        "model": "dgx-h100 gpu.gemm" + (" (refitted)" if a.fit else ""),
        "targets": {"mape_pct": TARGET_MAPE, "worst_pct": TARGET_WORST},
        "scores": scores,
        "unaligned_efficiency_source": unaligned_from_exec_trace(),
        "copy_engine": copy_engine(),
        "exec_trace_aside": exec_trace_aside(model),
        "rows": pd.concat([v.assign(part=k) for k, v in scored.items()]).to_dict("records"),
    }
    if not a.fit:
        OUT.mkdir(parents=True, exist_ok=True)
        atomic_write_text(OUT / "gpu_model_h100.json", json.dumps(result, indent=1))
        atomic_write_text(OUT / "gpu_model_h100.md", report(result))
    for k, s in scores.items():
        print(
            f"{k:10s} {s['rows']:3d} rows  MAPE {s['mape_pct']:5.1f}%  worst "
            f"{s['worst_pct']:5.1f}%  {s['worst']}"
        )
    return 0


def report(r: dict) -> str:
    s = r["scores"]
    lines = [
        "# The dgx-h100 GPU model against one measured H100 SXM (no calibration)",
        "",
        f"Data: `{r['data']}` (`h100_micro.csv`, `gemm_layout.txt`). Model: `{r['model']}` "
        f"(sim.hardware.costs.gemm). Target: MAPE <= {TARGET_MAPE:.0f}%, no shape worse than "
        f"{TARGET_WORST:.0f}%, on the GEMMs as training runs them. Made by "
        "`python benchmarks/gpu_model_h100.py`.",
        "",
        "| rows | count | MAPE | worst | worst shape |",
        "|---|---:|---:|---:|---|",
    ]
    names = {
        "in_sample": "in sample (fitted: mixtral, switch-base, tf32)",
        "held_out": "held out (gpt-moe-1.3b, gemm_layout.txt)",
        "unaligned": "apart: materialised operand, unaligned leading dim",
    }
    for k, name in names.items():
        v = s[k]
        lines.append(
            f"| {name} | {v['rows']} | {v['mape_pct']:.1f}% | {v['worst_pct']:.1f}% | "
            f"{v['worst']} |"
        )
    ce = r["copy_engine"]
    lines += ["", "## Copy engine and interference (same folder)", ""]
    for kind in ("d2h", "h2d"):
        c = ce[kind]
        lines.append(
            f"- pinned {kind} of 1 GiB: measured {c['measured_s'] * 1e3:.2f} ms "
            f"({c['measured_GBps']:.1f} GB/s), simulated {c['simulated_s'] * 1e3:.2f} ms "
            f"({c['error_pct']:+.1f}%)"
        )
    i = ce["interference"]
    lines.append(
        f"- GEMM beside a d2h: measured speed {i['gemm_speed_beside_d2h_measured']:.3f} (preset "
        f"{i['preset_compute_beside_copy']:.2f}); d2h beside a GEMM: "
        f"{i['d2h_speed_beside_gemm_measured']:.3f} (preset {i['preset_copy_beside_compute']:.2f})"
    )
    if r["exec_trace_aside"]:
        errs = [x["error_pct"] for x in r["exec_trace_aside"]]
        lines += [
            "",
            "## Aside: the executor's bf16 GEMMs (exec_trace_big_layer.csv)",
            "",
            f"Forward and dgrad GEMMs of C = 19,661: errors {min(errs):+.0f}% to "
            f"{max(errs):+.0f}%. The same forward GEMM ran ~15% faster in the executor than in "
            "gemm_layout.py. The executor fills its buffers with small uniform values "
            "(rand x 0.01), the micro-benchmarks with randn; a GPU at its power limit clocks "
            "higher on data that toggles fewer bits, a likely cause (not measured here). The "
            "model follows the randn files.",
        ]
    lines += [
        "",
        "## Every row",
        "",
        "| part | bench | dtype | b | m | n | k | layout | measured (us) | model (us) | error |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for x in r["rows"]:
        lines.append(
            f"| {x['part']} | {x['bench']} | {x['dtype']} | {x['batch']} | {x['m']} | {x['n']} "
            f"| {x['k']} | {x['layout']} | {x['seconds'] * 1e6:.1f} | {x['predicted'] * 1e6:.1f} "
            f"| {100 * x['error']:+.1f}% |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
