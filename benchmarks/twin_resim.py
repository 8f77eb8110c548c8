"""Re-simulate recorded GPU-suite validations with other calibrations and launch costs, offline.

A suite run (`benchmarks/gpu_suite.py`) keeps what its validation needs to be simulated again:
the layer (`twin/layer.yaml`), the one-GPU topology, the calibration and the measured
makespans (`twin/validate/validation.json`). This script simulates each run's graphs again

- with every given run's calibration (a calibration judged on measurements it was not made
  beside: two runs' estimators compared on both runs' measurements), and
- with the launch thread's costs (`costs.launch`, sim.hardware.costs.launch) replaced by
  variants of the run's own measurement, and without the calibration's jitter,

and scores each against the same measurements, without a GPU:

    R=reports/gpu-h200-2026-11-27
    python benchmarks/twin_resim.py $R/run2 $R/run3 $R/run3/big

The variants are fixed here (none, the calibration's means, its medians, medians x 0.6, GEMMs
alone x 0.3, no jitter): ways to read recorded runs, not a fit. A folder may also be a bare
validation (`validate/validation.json` beside `calibration.yaml`, `layer.yaml`,
`topology.yaml`). Results go to benchmarks/results/twin_resim_<last folder name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, record  # noqa: E402
from exec.measure import validation as V  # noqa: E402
from sim.config import RunConfig  # noqa: E402
from sim.engine.engine import simulate  # noqa: E402
from sim.hardware.costs import CostModel  # noqa: E402
from sim.hardware.topology import Topology  # noqa: E402
from sim.strategies import Cluster  # noqa: E402


def files(folder: Path) -> dict[str, Path]:
    """A run's inputs: a suite folder's `twin/`, or the folder itself."""
    twin = folder / "twin" if (folder / "twin").is_dir() else folder
    out = {
        "layer": twin / "layer.yaml",
        "topology": twin / "topology.yaml",
        "calibration": twin / "calibration.yaml",
        "validation": twin / "validate" / "validation.json",
    }
    missing = [str(p) for p in out.values() if not p.is_file()]
    if missing:
        sys.exit(f"{folder}: not a recorded validation (missing {', '.join(missing)})")
    return out


def variants(launch: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """costs overlays: the launch thread's cost per kind from the calibration's figures."""
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
        "no jitter": {"jitter": None},
    }


def errors(run: dict[str, Path], calibration: Path, extra: dict[str, Any]) -> dict[str, float]:
    """Signed % error of the simulated makespan per graph of the run's validation."""
    doc = json.loads(run["validation"].read_text())
    measured = {r["graph"]: float(r["measured_s"]) for r in doc["results"]}
    cfg = RunConfig.load(run["layer"])
    layer = cfg.layer(1)
    topo = Topology.load(str(run["topology"]), nodes=1)
    costs = CostModel.build(topo, {"calibration": str(calibration), **extra})
    cluster = Cluster(topo, costs)
    out = {}
    for case in V.cases(
        layer.capacity, sorted({r["graph"].rsplit(" ", 1)[0] for r in doc["results"]})
    ):
        if case.name in measured:
            sim = simulate(V.case_graph(cfg, layer, case, cluster), topo, costs).makespan
            out[case.name] = 100 * (sim / measured[case.name] - 1)
    return out


def table(title: str, rows: dict[str, dict[str, float]]) -> list[str]:
    graphs = list(next(iter(rows.values())))
    lines = [
        f"### {title}",
        "",
        "| | MAPE | " + " | ".join(graphs) + " |",
        "|---|---:|" + "---:|" * len(graphs),
    ]
    for name, errs in rows.items():
        mape = sum(abs(e) for e in errs.values()) / len(errs)
        lines.append(
            f"| {name} | {mape:.1f} | " + " | ".join(f"{errs[g]:+.1f}" for g in graphs) + " |"
        )
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="recorded suite folders (with twin/)")
    args = ap.parse_args()
    runs = {str(p): files(p) for p in args.runs}
    lines = [
        "# Recorded twin validations, re-simulated",
        "",
        f"Simulated here on {machine()}; the measurements are the folders' (device: see their "
        "summary.md). Signed error % of the simulated makespan per graph.",
        "",
    ]
    data: dict[str, Any] = {"runs": list(runs), "cross": {}, "variants": {}}
    for name, run in runs.items():
        same_graphs = [
            o for o, r in runs.items() if r["layer"].read_text() == run["layer"].read_text()
        ]
        if (
            len(same_graphs) > 1
        ):  # the same layer: every such run's calibration on these measurements
            cross = {
                f"calibration of {o}": errors(run, runs[o]["calibration"], {}) for o in same_graphs
            }
            data["cross"][name] = cross
            lines += table(f"Measurements of {name}, each run's calibration", cross)
        launch = yaml.safe_load(run["calibration"].read_text()).get("launch") or {}
        if launch:
            var = {
                v: errors(run, run["calibration"], extra) for v, extra in variants(launch).items()
            }
            data["variants"][name] = var
            lines += table(f"Measurements and calibration of {name}, other launch costs", var)
    record(f"twin_resim_{args.runs[-1].name}", data, lines)


if __name__ == "__main__":
    main()
