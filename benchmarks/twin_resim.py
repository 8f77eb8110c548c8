"""Re-simulate a recorded GPU-suite validation with other host launch costs, offline.

A suite run (`benchmarks/gpu_suite.py`) keeps what its validation needs to be simulated again:
the layer (`twin/layer.yaml`), the one-GPU topology, the calibration and the measured
makespans (`twin/validate.csv`). This script simulates the same graphs again with the launch
thread's costs (`costs.launch`, sim.hardware.costs.launch) replaced by variants of the
calibration's own measurement, and scores each variant against the same measurements: how
much the validation depends on the estimator of the host's issue cost, without a GPU.

    python benchmarks/twin_resim.py reports/gpu-h200-2026-11-27/run2

The variants are fixed here (none, the calibration's means, its medians, medians x 0.6, GEMMs
alone x 0.3): a way to read one recorded run, not a fit. Results go to
benchmarks/results/twin_resim_<folder name>.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, record  # noqa: E402
from benchmarks.gpu_suite_parts.plan import LAYER_STRATEGIES  # noqa: E402
from exec.measure import validation as V  # noqa: E402
from sim.config import RunConfig  # noqa: E402
from sim.engine.engine import simulate  # noqa: E402
from sim.hardware.costs import CostModel  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from sim.strategies import Cluster  # noqa: E402


def variants(launch: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """costs overlays: the launch thread's cost per kind, from the calibration's figures."""
    mean = {k: v["mean"] for k, v in launch.items()}
    med = {k: v["median"] for k, v in launch.items()}
    return {
        "no launch cost": {"launch": dict.fromkeys(mean, 0.0)},
        "calibrated means (what runs use)": {},
        "medians": {"launch": med},
        "medians x 0.6": {"launch": {k: 0.6 * v for k, v in med.items()}},
        "means, GEMMs x 0.3": {
            "launch": {k: v * (0.3 if k == "gemm" else 1) for k, v in mean.items()}
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", type=Path, help="a recorded suite folder (with twin/)")
    args = ap.parse_args()
    twin = args.suite / "twin"
    cal_path = twin / "calibration.yaml"
    launch = yaml.safe_load(cal_path.read_text()).get("launch") or {}
    if not launch:
        sys.exit(f"{cal_path}: no launch costs (a calibration from before they were measured)")
    cfg = RunConfig.load(twin / "layer.yaml")
    measured = pd.read_csv(twin / "validate.csv").set_index("graph")["measured_s"]
    topo = Topology.load(str(twin / "topology.yaml"), nodes=1)
    layer = cfg.layer(1)
    table: dict[str, dict[str, float]] = {}
    for name, extra in variants(launch).items():
        costs = CostModel.build(topo, {"calibration": str(cal_path), **extra})
        cluster = Cluster(topo, costs)
        errs = {}
        for case in V.cases(layer.capacity, list(LAYER_STRATEGIES)):
            graph = V.case_graph(cfg, layer, case, cluster)
            sim = simulate(graph, topo, costs).makespan
            errs[case.name] = 100 * (sim / float(measured[case.name]) - 1)
        table[name] = errs
    graphs = list(next(iter(table.values())))
    lines = [
        f"# The recorded validation of {args.suite}, re-simulated with other launch costs",
        "",
        f"Measured makespans: `{twin / 'validate.csv'}` (device: see the folder's summary.md). "
        f"Simulated here on {machine()}. Signed error % of the simulated makespan.",
        "",
        "| launch costs | MAPE | " + " | ".join(graphs) + " |",
        "|---|---:|" + "---:|" * len(graphs),
    ]
    data = {"suite": str(args.suite), "variants": {}}
    for name, errs in table.items():
        mape = sum(abs(e) for e in errs.values()) / len(errs)
        data["variants"][name] = {"mape_pct": mape, "error_pct": errs}
        lines.append(
            f"| {name} | {mape:.1f} | " + " | ".join(f"{errs[g]:+.1f}" for g in graphs) + " |"
        )
    record(f"twin_resim_{args.suite.name}", data, lines)


if __name__ == "__main__":
    main()
