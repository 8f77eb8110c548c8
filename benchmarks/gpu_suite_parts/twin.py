"""Parts `calibrate`, `validate` and `block`: the twin measured against itself, through the
`moesim` command line (its subcommands are the stable interface; nothing of sim or exec is
imported here).

- calibrate: `moesim calibrate --nprocs 1` (NCCL on a GPU, gloo in the dry run), which fits
  GEMMs per dtype (bf16, fp16, fp32, TF32 on a GPU; on a CPU every dtype stands in as fp32)
  in the three layouts autograd runs, and profiles exactly the GEMM shapes of the layer set
  (`--shapes-from` the bf16 layer, `--strategies` the set). Each dtype's fitted GEMM rate
  goes to `twin/calibration.csv`.
- validate: `moesim validate` of the bf16 layer set (sequential, pipelined r=4, MPipeMoE S1
  offload and S4 recompute; fwd and fwd+bwd) on a one-GPU topology made from the device's
  preset (its gpu section, a host behind its PCIe link class, for the offload's copies):
  MAPE, worst and best graph, measured vs simulated. The dry run measures the offload's two
  graphs (plan.LAYER_STRATEGIES_DRY); its calibration builds them all.
- validate_big (twin_big.py): the same two commands, `calibrate` and `validate` here, on a
  larger GPU-bound layer with its own calibration.
- block: one transformer block (attention + MoE) as the executor runs it: `moesim graph`
  of the block config, `moesim exec` of that graph (median of BLOCK_REPEATS runs) and
  `moesim simulate` of it with the calibration (`moesim validate` runs MoE layers only).

The layer is the shared H100 run's (B=4, L=1024, M=2048, H=8192, 2 experts, top-2, f=1.2,
bf16; validation_report_calibrated.md there), so the two recordings compare; the dry run's
is tiny.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from .common import Ctx, moesim, read_yaml, run_cmd, write_rows, write_text
from .plan import BLOCK_REPEATS, LAYER_STRATEGIES, LAYER_STRATEGIES_DRY, VALIDATE_REPEATS

LAYER = dict(batch=4, seq_len=1024, model_dim=2048, hidden_dim=8192, experts_per_gpu=2)
LAYER_DRY = dict(batch=1, seq_len=64, model_dim=64, hidden_dim=128, experts_per_gpu=2)
BLOCKS = {"n": 1, "heads": 16, "moe_every": 1}  # head dim 128
BLOCKS_DRY = {"n": 1, "heads": 4, "moe_every": 1}

CAL_COLUMNS = ["dtype", "alpha_s", "beta_s_per_flop", "tflops", "peak", "peak_share", "r2", "note"]
VAL_COLUMNS = ["graph", "measured_s", "simulated_s", "error_pct", "runs_s", "tasks_matched"]


def backend(ctx: Ctx) -> str:
    return "gloo" if ctx.device.type != "cuda" else "nccl"


def config(ctx: Ctx, blocks: bool, layer: dict[str, int] | None = None) -> dict[str, Any]:
    """The run config of `layer` (default: the layer set's), bf16, top-2, f=1.2."""
    model: dict[str, Any] = dict(layer or (LAYER_DRY if ctx.dry else LAYER))
    model.update(top_k=2, capacity_factor=1.2, dtype="bf16")
    if blocks:
        model["blocks"] = dict(BLOCKS_DRY if ctx.dry else BLOCKS)
    return {
        "topology": "localhost-cpu",  # what `moesim simulate` of the file alone would use
        "nodes": 1,
        "model": model,
        "strategy": {"name": "sequential"},
        "passes": ["fwd", "bwd"],
    }


def one_gpu_topology(ctx: Ctx) -> dict[str, Any]:
    """The device's preset cut to one GPU with a host behind its PCIe link class (the
    offload's d2h / h2d copies need a route); one rank never uses the fabric."""
    p = ctx.preset
    if not p.get("gpu"):
        raise RuntimeError(f"no topology preset for this device ({p.get('note')})")
    pcie = p.get("pcie_class")
    classes: dict[str, Any] = {"loopback": {"bw": 1.0e12, "latency": 1.0e-6, "efficiency": 1.0}}
    if pcie:
        classes[pcie] = dict(p["link_classes"][pcie])
    else:  # the CPU stand-in: a host copy is a memcpy (assumed at the preset's memory rate)
        pcie = "host_copy"
        classes[pcie] = {"bw": float(p.get("mem_bw") or 5e9), "latency": 1e-6, "efficiency": 1.0}
    return {
        "name": f"{p.get('name', 'device')}-1gpu",
        "description": f"one {p.get('model')} of {p.get('file')} with a host "
        "(benchmarks/gpu_suite.py)",
        "nodes": 1,
        "gpus_per_node": 1,
        "gpu": p["gpu"],
        "node": {
            "devices": {"host": "host"},
            "links": [{"a": "gpu0", "b": "host", "class": pcie}],
            "nic_of_gpu": ["gpu0"],
        },
        "fabric": {"type": "switch", "class": "loopback", "attach": ["gpu0"]},
        "link_classes": classes,
        "network": {"alpha": 1.0e-6},
    }


def files(ctx: Ctx) -> dict[str, Path]:
    twin = ctx.out / "twin"
    twin.mkdir(parents=True, exist_ok=True)
    f = {
        "layer": twin / "layer.yaml",
        "block": twin / "block.yaml",
        "topology": twin / "topology.yaml",
        "calibration": twin / "calibration.yaml",
    }
    if not f["layer"].exists():
        write_text(ctx, "twin/layer.yaml", yaml.safe_dump(config(ctx, False), sort_keys=False))
        write_text(ctx, "twin/block.yaml", yaml.safe_dump(config(ctx, True), sort_keys=False))
        if ctx.preset.get("gpu"):
            topo = yaml.safe_dump(one_gpu_topology(ctx), sort_keys=False)
            write_text(ctx, "twin/topology.yaml", topo)
    return f


def no_topology(ctx: Ctx, f: dict[str, Path]) -> dict[str, Any] | None:
    if f["topology"].is_file():
        return None
    why = ctx.preset.get("note") or "no topology preset for this device"
    return {"status": "skipped", "reason": f"nothing to simulate on: {why}"}


def calibrate(
    ctx: Ctx, layer: Path, out: Path, strategies: tuple[str, ...], log: Path, csv: str
) -> tuple[dict[str, Any] | None, str]:
    """`moesim calibrate --shapes-from layer --strategies ...` into `out`; each dtype's fitted
    GEMM rate to `csv`. ({path, meta, gemm rows}, "") or (None, why it failed)."""
    cmd = moesim(
        "calibrate",
        "--nprocs",
        "1",
        "--backend",
        backend(ctx),
        "--shapes-from",
        str(layer),
        "--strategies",
        *strategies,
        "--timeout",
        "60",
        "--out",
        str(out),
        *(["--quick"] if ctx.dry else []),
    )
    rc, last = run_cmd(ctx, cmd, log)
    if rc != 0 or not out.is_file():
        return None, f"moesim calibrate exit {rc}: {last}"
    cal = read_yaml(out)
    meta = cal.get("meta") or {}
    rows = []
    for dtype, fit in sorted(((cal.get("compute") or {}).get("gemm") or {}).items()):
        if not isinstance(fit, dict) or not fit.get("beta"):
            continue
        rate = 1.0 / float(fit["beta"])
        peak = (ctx.preset.get("peak_flops") or {}).get(dtype)
        stand = (meta.get("stand_ins") or {}).get(dtype)
        rows.append(
            {
                "dtype": dtype,
                "alpha_s": float(fit.get("alpha", 0.0)),
                "beta_s_per_flop": float(fit["beta"]),
                "tflops": rate / 1e12,
                "peak": peak or "",
                "peak_share": rate / peak if peak else "",
                "r2": fit.get("r2", ""),
                "note": f"{dtype} runs as {stand}" if stand else "",
            }
        )
    write_rows(ctx, csv, rows, CAL_COLUMNS)
    return {"path": out, "meta": meta, "gemm": rows}, ""


def run_calibrate(ctx: Ctx) -> dict[str, Any]:
    f = files(ctx)
    twin = ctx.out / "twin"
    cal, why = calibrate(
        ctx,
        f["layer"],
        f["calibration"],
        LAYER_STRATEGIES,
        twin / "calibrate.log",
        "twin/calibration.csv",
    )
    if cal is None:
        return {"status": "failed", "reason": why}
    ctx.shared["calibration"] = cal
    dtypes = ", ".join(f"{r['dtype']} {r['tflops']:.4g} TFLOP/s" for r in cal["gemm"])
    return {"status": "ran", "gemm fits": dtypes, "device": cal["meta"].get("device_name")}


def _need_calibration(ctx: Ctx) -> Path | None:
    cal = ctx.shared.get("calibration")
    return cal["path"] if cal else None


def run_validate(ctx: Ctx) -> dict[str, Any]:
    cal = _need_calibration(ctx)
    if cal is None:
        return {"status": "skipped", "reason": "no calibration (the calibrate part did not run)"}
    f = files(ctx)
    if skip := no_topology(ctx, f):
        return skip
    strategies = LAYER_STRATEGIES_DRY if ctx.dry else LAYER_STRATEGIES
    twin = ctx.out / "twin"
    return validate(ctx, f["layer"], cal, strategies, twin / "validate", "validate")


def validate(
    ctx: Ctx, layer: Path, cal: Path, strategies: tuple[str, ...], out: Path, name: str
) -> dict[str, Any]:
    """`moesim validate` of `layer` (fwd and fwd+bwd of each strategy) with calibration `cal`
    on the one-GPU topology into `out`; its log twin/<name>.log, rows twin/<name>.csv, the
    summary's numbers ctx.shared[name]. The part's result."""
    cmd = moesim(
        "validate",
        str(layer),
        "--nprocs",
        "1",
        "--backend",
        backend(ctx),
        "--calibration",
        str(cal),
        "--topology",
        str(files(ctx)["topology"]),
        "--repeats",
        str(1 if ctx.dry else VALIDATE_REPEATS),
        "--strategies",
        *strategies,
        "--timeout",
        "60",
        "--out",
        str(out),
    )
    rc, last = run_cmd(ctx, cmd, ctx.out / "twin" / f"{name}.log")
    vj = out / "validation.json"
    if rc != 0 or not vj.is_file():
        return {"status": "failed", "reason": f"moesim validate exit {rc}: {last}"}
    doc = json.loads(vj.read_text())
    s = doc.get("summary") or {}
    rows = [
        {
            "graph": r.get("graph"),
            "measured_s": r.get("measured_s"),
            "simulated_s": r.get("simulated_s"),
            "error_pct": r.get("error_pct"),
            "runs_s": " ".join(f"{x:.6g}" for x in r.get("measured_runs_s") or []),
            "tasks_matched": r.get("tasks_matched"),
        }
        for r in doc.get("results") or []
    ]
    write_rows(ctx, f"twin/{name}.csv", rows, VAL_COLUMNS)
    errs = [(abs(float(r["error_pct"])), r["graph"]) for r in rows if r["error_pct"] is not None]
    best = min(errs) if errs else (None, None)
    worst = max(errs) if errs else (None, None)
    res = {
        "mape_pct": s.get("mape_pct"),
        "worst_pct": worst[0],
        "worst_graph": worst[1],
        "best_pct": best[0],
        "best_graph": best[1],
        "mape_fastest_run_pct": s.get("mape_fastest_run_pct"),
        "best_measured": s.get("best_measured"),
        "best_simulated": s.get("best_simulated"),
        "same_best": s.get("same_best"),
        "trust_warning": (s.get("trust") or {}).get("warning"),
        "context": doc.get("context"),
    }
    ctx.shared[name] = {**res, "rows": rows}
    return {"status": "ran", **{k: res[k] for k in ("mape_pct", "worst_pct", "best_pct")}}


def run_block(ctx: Ctx) -> dict[str, Any]:
    cal = _need_calibration(ctx)
    if cal is None:
        return {"status": "skipped", "reason": "no calibration (the calibrate part did not run)"}
    f = files(ctx)
    if skip := no_topology(ctx, f):
        return skip
    d = ctx.out / "twin" / "block"
    log = ctx.out / "twin" / "block.log"
    graph = d / "graph.json"
    d.mkdir(parents=True, exist_ok=True)
    rc, last = run_cmd(
        ctx,
        moesim(
            "graph",
            str(f["block"]),
            "--topology",
            str(f["topology"]),
            "--nodes",
            "1",
            "-o",
            str(graph),
        ),
        log,
    )
    if rc != 0:
        return {"status": "failed", "reason": f"moesim graph exit {rc}: {last}"}
    measured = []
    for i in range(1 if ctx.dry else BLOCK_REPEATS):
        run = d / f"exec{i}"
        rc, last = run_cmd(
            ctx,
            moesim(
                "exec",
                str(graph),
                "--nprocs",
                "1",
                "--backend",
                backend(ctx),
                "--warmup",
                "2",
                "--timeout",
                "60",
                "--out",
                str(run),
            ),
            log,
        )
        if rc != 0 or not (run / "summary.json").is_file():
            return {"status": "failed", "reason": f"moesim exec exit {rc}: {last}"}
        measured.append(float(json.loads((run / "summary.json").read_text())["makespan_s"]))
    sim = d / "simulated"
    rc, last = run_cmd(
        ctx,
        moesim(
            "simulate",
            str(graph),
            "--topology",
            str(f["topology"]),
            "--nodes",
            "1",
            "--calibration",
            str(cal),
            "--out",
            str(sim),
        ),
        log,
    )
    if rc != 0 or not (sim / "summary.json").is_file():
        return {"status": "failed", "reason": f"moesim simulate exit {rc}: {last}"}
    simulated = float(json.loads((sim / "summary.json").read_text())["makespan_s"])
    med = statistics.median(measured)
    res = {
        "measured_s": med,
        "runs_s": measured,
        "simulated_s": simulated,
        "error_pct": 100.0 * (simulated - med) / med if med > 0 else None,
        "tasks": len(json.loads(graph.read_text()).get("tasks") or []),
    }
    write_rows(
        ctx,
        "twin/block.csv",
        [{**res, "runs_s": " ".join(f"{x:.6g}" for x in measured)}],
        ["measured_s", "simulated_s", "error_pct", "runs_s", "tasks"],
    )
    ctx.shared["block"] = res
    return {"status": "ran", "error_pct": res["error_pct"]}
