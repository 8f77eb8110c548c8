"""Golden outputs: the graphs, traces and summaries of every preset x strategy, digested.

Restructuring the packages (or adding a fast path such as simulating one representative per
class of equivalent ranks) must not change what the simulator says. `python -m
tests.golden.outputs --write` records the digests in `digests.json`; `tests/test_golden.py`
recomputes them and names every case that moved.

Digests are taken of values rounded to 10 significant digits, so a change in the last bits of
a float sum (another but equivalent order of additions) does not count as a change in output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "digests.json"

PRESETS = {  # preset -> nodes: the smallest multi-node world where the preset has nodes
    "dgx-a100": 2,
    "dgx-h100": 2,
    "dgx-h100-superpod": 2,
    "flat-switch": 8,
    "localhost-cpu": 4,
    "p3dn-v100": 2,
    "p4de-a100": 2,
    "parm-4090": 1,
    "pipemoe-2080ti": 2,
}

STRATEGIES: list[dict[str, Any]] = [
    {"name": "sequential"},
    {"name": "pipelined", "degree": 4, "order": "tutel"},
    {"name": "pipelined", "degree": 2, "order": "alternating", "algo": "2dh"},
    {"name": "pipelined", "degree": 4, "order": "two_streams"},
    {"name": "pipemoe"},
    {"name": "tutel"},
    {"name": "ted", "tp": 2},
    {"name": "fastermoe"},
    {"name": "fastermoe", "group_size": 2, "shadow": "auto"},
    {"name": "mpipemoe", "degree": 2, "reuse": "S1"},
    {"name": "mpipemoe"},
]

AB_FITS: dict[str, Any] = {  # explicit fits, so every preset can run alpha-beta costs
    "alpha_beta": {"gemm": {"alpha": 2.0e-5, "beta": 1.0e-14}},
    "collectives": {
        k: {"alpha": 2.0e-5, "beta": 3.0e-10}
        for k in ("all_to_all", "all_to_allv", "all_gather", "reduce_scatter", "all_reduce")
    },
}

VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "zipf": {"model": {"routing": {"kind": "zipf", "s": 1.2, "seed": 3}}},
    "alphabeta": {"costs": {"compute": "alpha_beta", "network": "collective", **AB_FITS}},
    "half_experts": {"model": {"experts_per_gpu": None, "experts_half_world": True}},
}

MODEL = {
    "batch": 2,
    "seq_len": 256,
    "model_dim": 512,
    "hidden_dim": 1024,
    "experts_per_gpu": 2,
    "top_k": 2,
    "capacity_factor": 1.2,
    "dtype": "fp16",
}


def _localhost_dtype(preset: str) -> str:
    return "fp32" if preset == "localhost-cpu" else "fp16"


def configs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for preset, nodes in PRESETS.items():
        for strat in STRATEGIES:
            for vname, var in VARIANTS.items():
                if vname == "alphabeta" and strat["name"] not in ("sequential", "pipelined"):
                    continue  # alpha-beta costs are per-collective; two strategies suffice
                model = {**MODEL, "dtype": _localhost_dtype(preset)}
                if vname == "half_experts":
                    if strat["name"] != "tutel":
                        continue
                    model.pop("experts_per_gpu")
                    model["experts"] = "HALF_WORLD"
                else:
                    model.update(var.get("model", {}))
                costs = dict(var.get("costs", {}))
                if strat["name"] == "pipemoe":  # its selector reads alpha-beta GEMM costs
                    costs = {**AB_FITS, **costs, "compute": "alpha_beta"}
                if strat.get("algo") == "2dh" and vname == "zipf":
                    continue  # 2DH has no all-to-allv form
                cfg = {
                    "topology": preset,
                    "nodes": nodes,
                    "model": model,
                    "strategy": dict(strat),
                    "passes": ["fwd", "bwd"],
                    "costs": costs,
                }
                label = "-".join(f"{k}={v}" for k, v in strat.items() if k != "name")
                out.append((f"{preset}/{strat['name']}[{label}]/{vname}", cfg))
    return out


def _round(x: Any) -> Any:
    if isinstance(x, float):
        if not math.isfinite(x) or x == 0.0:
            return x
        return float(f"{x:.10g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def _sha(obj: Any) -> str:
    text = json.dumps(_round(obj), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def digest(cfg: dict[str, Any]) -> dict[str, Any]:
    import sim.commands as commands
    from sim.core.errors import MoesimError

    cfg = json.loads(json.dumps(cfg))
    if cfg["model"].get("experts") == "HALF_WORLD":
        from sim.hardware.topology import Topology

        world = Topology.load(cfg["topology"], nodes=cfg["nodes"]).world_size
        cfg["model"]["experts"] = max(1, world // 2)
    try:
        r = commands.simulate_config(cfg)
    except MoesimError as e:
        return {"error": str(e)}
    summary = {k: v for k, v in r.summary.items() if k not in ("wall_s", "files")}
    trace = r.trace.sort_values(["rank", "id"]).to_dict(orient="list")
    return {
        "makespan_s": _round(float(r.summary["makespan_s"])),
        "tasks": len(r.graph.tasks),
        "graph": _sha(r.graph.to_dict()),
        "trace": _sha(trace),
        "summary": _sha(summary),
    }


def compute(only: str | None = None) -> dict[str, dict[str, Any]]:
    return {name: digest(cfg) for name, cfg in configs() if only is None or only in name}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="record the digests")
    p.add_argument("--only", help="substring of case names")
    a = p.parse_args(argv)
    got = compute(a.only)
    if a.write:
        DIGESTS.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} cases to {DIGESTS}")
        return 0
    want = json.loads(DIGESTS.read_text())
    moved = [k for k in got if got[k] != want.get(k)]
    for k in moved:
        print(f"{k}: {want.get(k)} -> {got[k]}")
    print(f"{len(got) - len(moved)} same, {len(moved)} moved")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
