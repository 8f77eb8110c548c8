"""`moesim whatif`: a what-if study (sim.analysis.whatif.study) as the command runs it, its
output files and its before / after table."""

from __future__ import annotations

import json
from typing import Any

from sim.analysis.trace import write_trace_files
from sim.analysis.whatif.study import whatif
from sim.core.io import OutputSet, check_output_dir


def whatif_command(
    base: str,
    sets: list[str],
    topology: str | None = None,
    nodes: int | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    """`moesim whatif BASE --set K=V ... [--topology T] [--nodes N] [--out DIR]`: before and
    after summaries; with `out`, each side's trace.csv, trace.chrome.json and summary.json
    under out/before and out/after, and out/whatif.json (both summaries and the changes)."""
    if out is not None:  # an unusable --out fails before both simulations, not after them
        check_output_dir(out)
    r = whatif(base, sets, topology=topology, nodes=nodes)
    result = {
        "base": str(base),
        "changes": r.after["whatif"]["changes"],
        "notes": r.after["whatif"]["notes"],
        "before": r.before,
        "after": r.after,
    }
    if out is not None:
        with OutputSet(out, "whatif") as oset:
            for side, s, df, res in (
                ("before", r.before, r.before_trace, r.before_sim),
                ("after", r.after, r.after_trace, r.after_sim),
            ):
                assert res is not None  # whatif() sets both simulations
                s["files"] = write_trace_files(oset, df, res.graph, res, f"{side}/")
                oset.write_text(f"{side}/summary.json", json.dumps(s, indent=2, default=str))
            result["files"] = {
                "whatif": str(oset.final("whatif.json")),
                "before": str(oset.final("before")),
                "after": str(oset.final("after")),
            }
            oset.write_text("whatif.json", json.dumps(result, indent=2, default=str))
    return result


def format_whatif(result: dict[str, Any]) -> str:
    """Before and after side by side."""
    b, a = result["before"], result["after"]
    rows = [
        ("makespan", b["makespan_s"] * 1e3, a["makespan_s"] * 1e3, "ms"),
        ("exposed comm", b["exposed_comm_s"] * 1e3, a["exposed_comm_s"] * 1e3, "ms"),
    ]
    for stream in sorted(set(b["busy_s"]) | set(a["busy_s"])):
        bb, aa = b["busy_s"].get(stream, 0.0), a["busy_s"].get(stream, 0.0)
        rows.append((f"busy {stream}", bb * 1e3, aa * 1e3, "ms"))
    gib = 2**30
    rows.append(
        (
            "peak activations",
            b["peak_activation_bytes"] / gib,
            a["peak_activation_bytes"] / gib,
            "GiB",
        )
    )
    for key, name in (("model_state_bytes", "model states"), ("peak_memory_bytes", "peak memory")):
        if b.get(key) is not None and a.get(key) is not None:  # unknown on old graphs
            rows.append((name, b[key] / gib, a[key] / gib, "GiB"))
    kept: list[Any] = [(s.get("tokens_per_layer") or {}).get("kept") for s in (b, a)]
    if None not in kept:  # (token, expert) choices one MoE layer keeps: the work done
        rows.append(("tokens kept/layer", float(kept[0]), float(kept[1]), ""))
    lines = [
        f"what-if on {result['base']}: {' '.join(result['changes']) or '(no change)'}",
        f"  {'':18s} {'before':>15s} {'after':>15s} {'change':>9s}",
        f"  {'cluster':18s} {_where(b):>15s} {_where(a):>15s}",
    ]
    for name, x, y, unit in rows:
        ch = f"{(y - x) / x:+.1%}" if x else "-"
        if not unit:  # a count
            lines.append(f"  {name:18s} {x:12,.0f}    {y:12,.0f}    {ch:>9s}")
            continue
        lines.append(f"  {name:18s} {x:12.3f} {unit:3s}{y:12.3f} {unit:3s}{ch:>9s}")
    lines += [f"  note: {n}" for n in result.get("notes", [])]
    for name, path in result.get("files", {}).items():
        lines.append(f"  wrote {name:8s} {path}")
    return "\n".join(lines)


def _where(s: dict[str, Any]) -> str:
    return f"{s['topology']}x{s['nodes']}"
