"""summary.md, summary.json and proposed_kernels.yaml: every part's status (ran, skipped with
its reason, failed, dropped by the budget), the key numbers, and the `gpu.kernels` values the
measurements give, each with its source, for a later session to paste into the device's
preset (reports/gpu-suite/README.md says how)."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from . import clocks
from .common import Ctx, write_text


def _ok(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [r for r in rows or [] if r.get("status") == "ok"]


def _f(x: Any, fmt: str = ".3g") -> str:
    if x is None or x == "":
        return "-"
    try:
        return format(float(x), fmt)
    except (TypeError, ValueError):
        return str(x)


def _range(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


# -- proposed gpu.kernels ----------------------------------------------------------------------
# The step model's output tile (sim.training.kernels.TILE, not imported: the suite runs where
# sim's own dependencies may be missing); tests/test_gpu_suite.py checks the two agree.
TILE = (128, 256)


def wave(shape: str, sms: int) -> float:
    """Share of the SM waves a GEMM's output tiles fill (sim.training.kernels.wave_share): the
    step model multiplies gemm[dtype] by it, so a measured share is divided by it."""
    dims = dict(kv.split("=") for kv in str(shape).split() if "=" in kv)
    if sms < 1 or "m" not in dims or "n" not in dims:
        return 1.0
    tiles = math.ceil(float(dims["m"]) / TILE[0]) * math.ceil(float(dims["n"]) / TILE[1])
    tiles *= max(1, int(dims.get("E", 1)))  # a grouped GEMM schedules all experts' tiles
    return tiles / (math.ceil(tiles / sms) * sms) if tiles else 1.0


def proposed(ctx: Ctx, source: str) -> dict[str, tuple[float, str]]:
    """{key: (value, source)} of the gpu.kernels figures measured (dotted keys: gemm.bf16).
    GEMM shares are in the step model's terms: over the SM waves the GEMM's tiles fill."""
    sh, out = ctx.shared, {}
    peak = ctx.preset.get("peak_flops") or {}

    def big(rows: Any, dtype: str) -> dict[str, Any] | None:
        cands = [r for r in _ok(rows) if r["dtype"] == dtype and "^3" in r["name"]]
        cands = [r for r in cands if r.get("layout") in ("fwd", "TN")]
        return max(cands, key=lambda r: r["flops"]) if cands else None

    sms = int((sh.get("env") or {}).get("sms") or 0)

    def waved(r: dict[str, Any]) -> tuple[float, str]:
        w = wave(r["shape"], sms)
        if w >= 1.0:
            return r["peak_share"], ""
        return r["peak_share"] / w, f" = {r['peak_share']:.3f} over the {w:.3f} of SM waves filled"

    ref = big(sh.get("gemm"), "bf16") or big(sh.get("grouped"), "bf16")
    if ref and ref.get("peak_share") != "":
        where = "kernels/gemm.csv" if ref["part"] == "gemm" else "kernels/grouped.csv (reference)"
        share, how = waved(ref)
        out["gemm.bf16"] = (
            share,
            f"measured: {source} {where}, {ref['shape']} bf16 torch.matmul "
            f"{ref['tflops']:.4g} TFLOP/s / {peak.get('bf16', 0) / 1e12:.4g}{how}",
        )
    f8 = [r for r in _ok(sh.get("fp8")) if "^3" in r["name"] and r.get("peak_share") != ""]
    if f8:
        b = max(f8, key=lambda r: r["tflops"])
        share, how = waved(b)
        out["gemm.fp8"] = (
            share,
            f"measured: {source} kernels/fp8.csv, {b['shape']} {b['impl']} {b['tflops']:.4g} "
            f"TFLOP/s / {peak.get('fp8', 0) / 1e12:.4g}{how}",
        )
    g = grouped_ratios(sh.get("grouped"), 0 if ctx.dry else 2048, sms)
    if g["best"]:
        # the step model multiplies the share by gemm.bf16's rate: count it against that
        # GEMM's run where there is one, not the grouped part's own reference run
        base = g["ref"]
        if ref and ref["part"] == "gemm":
            base = ref["tflops"] / wave(ref["shape"], sms)
        xs = [x * g["ref"] / base for x in g["best"]]
        out["grouped_gemm"] = (
            statistics.median(xs),
            f"measured: {source} kernels/grouped.csv, the presets' expert GEMMs (fc1, fc2; "
            f"fwd, dgrad, wgrad; {len(xs)} cases with >= {g['min_tokens']} tokens per expert), "
            "the best of "
            f"{'/'.join(sorted(g['impls']))} per case: median {statistics.median(xs):.2f} "
            f"(range {_range(xs)}) of the large GEMM's {base:.4g} TFLOP/s (gemm.bf16's run)"
            + (", each rate over the SM waves its tiles fill" if sms else ""),
        )
    for lay, key, extra in (("fwd", "attention_fwd", ""), ("bwd", "attention_bwd", ", 2.5x fwd")):
        a = attention_best(sh.get("attention"), lay)
        if a:
            xs = [r["peak_share"] for r in a]
            desc = ", ".join(f"{r['name']} L={r['seq']} {r['impl']} {r['tflops']:.4g}" for r in a)
            out[key] = (
                statistics.median(xs),
                f"measured: {source} kernels/attention.csv, causal, head dim 128, bf16, 4K-8K, "
                f"the fastest backend per shape: {desc} TFLOP/s / "
                f"{peak.get('bf16', 0) / 1e12:.4g} (FA FLOPs{extra})",
            )
    mem = [
        r
        for r in _ok(sh.get("memory"))
        if r.get("kernels") == 1 and not r["name"].startswith("router") and r["peak_share"] != ""
    ]
    if mem:
        xs = [r["peak_share"] for r in mem]
        out["memory_bound"] = (
            statistics.median(xs),
            f"measured: {source} kernels/memory.csv, single-kernel ops at deepseek-v3 sizes "
            f"({', '.join(r['name'] for r in mem)}): median {statistics.median(xs):.2f} "
            f"(range {_range(xs)}) of mem_bw",
        )
    host = [r for r in _ok(sh.get("launch")) if r.get("layout") == "host"]
    if host:
        xs = [r["median_s"] for r in host]
        out["launch_s"] = (
            statistics.median(xs),
            f"measured: {source} kernels/launch.csv, host time per eager op in a loop of "
            f"tiny ops ({', '.join(r['name'] for r in host)}): median "
            f"{statistics.median(xs) * 1e6:.1f} us (range {min(xs) * 1e6:.1f}-"
            f"{max(xs) * 1e6:.1f})",
        )
    return out


def grouped_ratios(rows: Any, min_tokens: int = 2048, sms: int = 0) -> dict[str, Any]:
    """Each expert-GEMM case's rate over the part's reference GEMM; with `sms`, each rate over
    the SM waves its tiles fill (the step model's terms), "ref" then the reference's so."""
    ok = _ok(rows)
    ref = next((r for r in ok if r["name"] == "reference"), None)
    res: dict[str, Any] = {"best": [], "by_impl": {}, "impls": set(), "ref": 0.0}
    res["min_tokens"] = min_tokens
    if not ref:
        return res
    res["ref"] = ref["tflops"] / wave(ref.get("shape", ""), sms)
    cases: dict[tuple, dict[str, float]] = {}
    for r in ok:
        if r["name"] == "reference" or r.get("tokens_per_expert", 0) < min_tokens:
            continue
        key = (r["name"], r["layout"], r["tokens_per_expert"])
        ratio = r["tflops"] / wave(r.get("shape", ""), sms) / res["ref"]
        cases.setdefault(key, {})[r["impl"]] = ratio
        res["impls"].add(r["impl"])
        res["by_impl"].setdefault(r["impl"], []).append(ratio)
    res["best"] = [max(v.values()) for v in cases.values()]
    return res


def attention_best(rows: Any, layout: str) -> list[dict[str, Any]]:
    """The fastest backend's row per GQA head-dim-128 shape at 4K and 8K tokens per sequence
    (the shapes the presets' published figures are of); the dry run's shapes stand in."""
    ok = [r for r in _ok(rows) if r["layout"] == layout and r["peak_share"] != ""]
    seqs = sorted({r["seq"] for r in ok})
    want = [
        r
        for r in ok
        if "GQA" in r["name"]
        and r["dqk"] == max((x["dqk"] for x in ok if "GQA" in x["name"]), default=0)
    ]
    want = [r for r in want if r["seq"] in seqs[-2:]]
    best: dict[tuple, dict[str, Any]] = {}
    for r in want:
        k = (r["name"], r["seq"])
        if k not in best or r["tflops"] > best[k]["tflops"]:
            best[k] = r
    return [best[k] for k in sorted(best)]


def proposed_yaml(ctx: Ctx, props: dict[str, tuple[float, str]], header: str) -> str:
    lines = [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    lines.append("kernels:")
    gemm = {k.split(".", 1)[1]: v for k, v in props.items() if k.startswith("gemm.")}
    if gemm:
        lines.append("  gemm:")
        for d, (v, src) in gemm.items():
            lines.append(f"    {d}: {v:.3g}    # {src}")
    else:
        lines.append("  # gemm: not measured")
    for key in ("grouped_gemm", "attention_fwd", "attention_bwd", "memory_bound", "launch_s"):
        if key in props:
            v, src = props[key]
            lines.append(f"  {key}: {v:.3g}    # {src}")
        else:
            lines.append(f"  # {key}: not measured in this run")
    return "\n".join(lines) + "\n"


# -- summary.md --------------------------------------------------------------------------------
def _md_table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def write(ctx: Ctx, parts: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    env = ctx.shared.get("env") or {}
    device = env.get("device", "unknown device")
    source = meta["source"]
    props = proposed(ctx, source)
    preset = ctx.preset
    header = (
        f"Proposed gpu.kernels for {preset.get('file')} ({preset.get('model')}), measured on "
        f"{device} on {meta['date']}\nby benchmarks/gpu_suite.py; recorded in {source}/. "
        "Paste each value with its comment over the preset's gpu.kernels entry;\nkeep the "
        "preset's figure where a value is missing here."
    )
    if ctx.dry:
        header = "DRY RUN on a CPU at tiny shapes: not GPU figures, nothing to paste.\n" + header
    ytext = proposed_yaml(ctx, props, header)
    write_text(ctx, "proposed_kernels.yaml", ytext)

    L: list[str] = [f"# GPU suite: {device}", ""]
    if ctx.dry:
        L += ["**Dry run** (CPU, gloo, tiny shapes): the code paths, not GPU figures.", ""]
    smi = env.get("nvidia_smi") or {}
    L += [
        f"- date: {meta['date']}; wall time {meta['wall_s']:.0f} s of a {meta['budget_s']:g} s "
        f"budget; command: `{meta['command']}`",
        f"- device: {device}; compute capability {env.get('capability', '-')}, "
        f"{env.get('sms', '-')} SMs, {_f((env.get('memory_bytes') or 0) / 2**30, '.1f')} GiB, "
        f"L2 {_f((env.get('l2_bytes') or 0) / 2**20, '.0f')} MiB",
        f"- driver {smi.get('driver_version', '-')}; SM clock {smi.get('clocks.sm', '-')} (max "
        f"{smi.get('clocks.max.sm', '-')}), memory clock {smi.get('clocks.mem', '-')} (max "
        f"{smi.get('clocks.max.mem', '-')}), power limit {smi.get('power.limit', '-')}",
        f"- torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, NCCL "
        f"{env.get('nccl')}, Python {env.get('python')}, host {env.get('host')} "
        f"({env.get('cpus')} CPUs)",
        f"- peaks from {preset.get('file')} ({preset.get('model')}): {preset.get('note', '')}",
    ]
    if env.get("sim_deps_missing"):
        L.append(f"- missing for `moesim`: {', '.join(env['sim_deps_missing'])}")
    L += ["", "## Parts", ""]
    L += _md_table(
        ["#", "part", "expected s (H100)", "wall s", "status", "reason / numbers"],
        [
            [
                p["priority"],
                p["name"],
                p["expected_s"],
                _f(p.get("wall_s"), ".1f"),
                p["status"],
                p.get("reason") or p.get("numbers") or "",
            ]
            for p in parts
        ],
    )
    L += _twin_md(ctx) + clocks.markdown(ctx.shared.get("clocks"))
    L += _replay_md(ctx) + _kernels_md(ctx)
    L += ["", "## Proposed gpu.kernels", "", "```yaml", ytext.rstrip(), "```", ""]
    write_text(ctx, "summary.md", "\n".join(L) + "\n")
    doc = {
        "device": device,
        "dry_run": ctx.dry,
        **{k: meta[k] for k in ("date", "wall_s", "budget_s", "command", "source")},
        "preset": {k: preset.get(k) for k in ("file", "model", "peak_flops", "mem_bw")},
        "parts": parts,
        "proposed_kernels": {k: {"value": v, "source": s} for k, (v, s) in props.items()},
        **{
            k: {x: y for x, y in (ctx.shared.get(k) or {}).items() if x != "rows"}
            for k in ("validate", "validate_big")
        },
        "block": ctx.shared.get("block"),
        "replay": {k: v for k, v in (ctx.shared.get("replay") or {}).items() if k != "job"},
        "clocks": ctx.shared.get("clocks"),
    }
    write_text(ctx, "summary.json", json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def _validation_md(v: dict[str, Any] | None, title: str) -> list[str]:
    if not v:
        return []
    mape = v.get("mape_pct")
    met = "met" if mape is not None and mape <= 10 else "NOT met"
    L = [
        "",
        f"## Twin: validation of {title}",
        "",
        f"- MAPE **{_f(mape, '.1f')}%** (target <= 10%: {met}); worst "
        f"{_f(v['worst_pct'], '.1f')}% ({v['worst_graph']}), best "
        f"{_f(v['best_pct'], '.1f')}% ({v['best_graph']}); against each graph's fastest "
        f"run {_f(v.get('mape_fastest_run_pct'), '.1f')}%",
        f"- fastest graph measured: {v.get('best_measured')}; simulated: "
        f"{v.get('best_simulated')} (same: {v.get('same_best')})",
    ]
    if v.get("trust_warning"):
        L.append(f"- warning: {v['trust_warning']}")
    ctxd = v.get("context") or {}
    if ctxd:
        L.append(f"- layer: {ctxd.get('layer')}; {ctxd.get('measured')}")
    if v.get("gemm_bf16_tflops"):
        L.append(f"- its own calibration's bf16 GEMM rate: {v['gemm_bf16_tflops']:.4g} TFLOP/s")
    return (
        L
        + [""]
        + _md_table(
            ["graph", "measured ms", "simulated ms", "error %"],
            [
                [
                    r["graph"],
                    _f(r["measured_s"] * 1e3, ".3f"),
                    _f(r["simulated_s"] * 1e3, ".3f"),
                    _f(r["error_pct"], "+.1f"),
                ]
                for r in v["rows"]
            ],
        )
    )


def _twin_md(ctx: Ctx) -> list[str]:
    sh = ctx.shared
    L = _validation_md(sh.get("validate"), "the bf16 layer set")
    b = sh.get("block")
    if b:
        L += [
            "",
            f"One transformer block (attention + MoE, {b['tasks']} tasks): measured "
            f"{b['measured_s'] * 1e3:.3f} ms (median of {len(b['runs_s'])}), simulated "
            f"{b['simulated_s'] * 1e3:.3f} ms, error {_f(b['error_pct'], '+.1f')}%.",
        ]
    c = sh.get("calibration")
    if c and c.get("gemm"):
        L += ["", "Calibrated GEMM rate per dtype (1 / fitted beta):", ""]
        L += _md_table(
            ["dtype", "TFLOP/s", "share of peak", "alpha us", "note"],
            [
                [
                    r["dtype"],
                    _f(r["tflops"], ".4g"),
                    _f(r["peak_share"], ".2f"),
                    _f(r["alpha_s"] * 1e6, ".1f"),
                    r["note"],
                ]
                for r in c["gemm"]
            ],
        )
    big = "the larger bf16 layer (GPU-bound; twin/big/layer.yaml)"
    return L + _validation_md(sh.get("validate_big"), big)


def _replay_md(ctx: Ctx) -> list[str]:
    r = ctx.shared.get("replay")
    if not r:
        return []
    e = r.get("error_pct")
    met = "met" if e is not None and abs(e) <= 5 else "NOT met"

    def ms(key: str) -> str:
        return _f((r.get(key) or 0) * 1e3, ".3f")

    return [
        "",
        "## Replay of the block step's Kineto trace",
        "",
        f"- replayed {ms('replayed_s')} ms vs the recorded ProfilerStep#1 "
        f"{ms('profiler_step_s')} ms: error **{_f(e, '+.1f')}%** (target within 5%: {met}); "
        f"the trace's ops span {ms('trace_span_s')} ms; an unprofiled step "
        f"{ms('unprofiled_step_s')} ms ({_f(r['error_vs_unprofiled_pct'], '+.1f')}%); "
        f"{r.get('tasks')} tasks",
    ]


def _kernels_md(ctx: Ctx) -> list[str]:
    sh = ctx.shared
    L: list[str] = []
    att = _ok(sh.get("attention"))
    if att:
        L += ["", "## Attention (causal, bf16): fastest backend per shape", ""]
        best: dict[tuple, dict[str, Any]] = {}
        for r in att:
            k = (r["name"], r["seq"], r["layout"])
            if k not in best or r["tflops"] > best[k]["tflops"]:
                best[k] = r
        L += _md_table(
            ["model", "L", "pass", "backend", "TFLOP/s", "share of bf16 peak"],
            [
                [k[0], k[1], k[2], r["impl"], _f(r["tflops"], ".4g"), _f(r["peak_share"], ".2f")]
                for k, r in sorted(best.items())
            ],
        )
    g = grouped_ratios(sh.get("grouped"), 0 if ctx.dry else 2048)
    if g["by_impl"]:
        L += [
            "",
            f"## Grouped expert GEMMs: share of one large GEMM ({g['ref']:.4g} TFLOP/s), "
            f">= {g['min_tokens']} tokens per expert",
            "",
        ]
        L += _md_table(
            ["impl", "median", "range", "cases"],
            [
                [i, _f(statistics.median(x), ".2f"), _range(x), len(x)]
                for i, x in sorted(g["by_impl"].items())
            ],
        )
    for part, title, col in (
        ("gemm", "GEMMs", "tflops"),
        ("fp8", "FP8 GEMMs", "tflops"),
        ("memory", "Memory-bound kernels", "gbps"),
        ("copy", "Copies", "gbps"),
    ):
        rows = _ok(sh.get(part))
        if not rows:
            continue
        unit = "TFLOP/s" if col == "tflops" else "GB/s"
        L += ["", f"## {title}", ""]
        L += _md_table(
            ["name", "impl", "layout", "shape", "dtype", "ms", unit, "share"],
            [
                [
                    r["name"],
                    r["impl"],
                    r["layout"],
                    r["shape"],
                    r["dtype"],
                    _f(r["median_s"] * 1e3, ".4g"),
                    _f(r[col], ".4g"),
                    _f(r["peak_share"], ".2f"),
                ]
                for r in rows
            ],
        )
    lr = _ok(sh.get("launch"))
    if lr:
        L += ["", "## Host time per eager op", ""]
        L += _md_table(
            ["op", "how", "us per op", "note"],
            [[r["name"], r["layout"], _f(r["median_s"] * 1e6, ".2f"), r["note"]] for r in lr],
        )
    return L
