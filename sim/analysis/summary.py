"""What a run comes down to: makespan, stream busy time, exposed communication, links, memory."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.analysis.trace.columns import busy_sums, col_array, stream_kinds
from sim.engine.engine import SimResult

if TYPE_CHECKING:
    import pandas as pd

    from sim.analysis.trace.columns import TraceTable


def merge(intervals: np.ndarray) -> list[tuple[float, float]]:
    if len(intervals) == 0:
        return []
    iv = intervals[np.argsort(intervals[:, 0])]
    out = [(float(iv[0, 0]), float(iv[0, 1]))]
    for s, e in iv[1:]:
        if s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], float(e))
        else:
            out.append((float(s), float(e)))
    return out


def exposed(comm: np.ndarray, compute: np.ndarray) -> float:
    """Time communication runs while no compute does: |union(comm) minus union(compute)|."""
    a, b = merge(comm), merge(compute)
    total, j = 0.0, 0
    for s, e in a:
        covered = 0.0
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            covered += min(e, b[k][1]) - max(s, b[k][0])
            k += 1
        total += (e - s) - covered
    return total


def exposed_per_rank(df: pd.DataFrame | TraceTable) -> list[float]:
    """Exposed communication of every rank (plain arrays: a groupby per rank is too slow
    at thousands of ranks)."""
    kind = stream_kinds(df)
    rank = col_array(df, "rank")
    iv = np.column_stack([col_array(df, "start", float), col_array(df, "end", float)])
    order = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.diff(rank[order])) + 1
    out = []
    for idx in np.split(order, bounds) if len(order) else []:
        k = kind[idx]
        out.append(exposed(iv[idx[k == "comm"]], iv[idx[k == "compute"]]))
    return out


def busy_per_stream(df: pd.DataFrame | TraceTable) -> dict[str, float]:
    """Mean busy time of each stream over the ranks that have it. A stream runs one task at a
    time (program order), so its busy time is the sum of its tasks' durations."""
    return {k: total / ranks for k, (total, ranks) in busy_sums(df).items()}


def _add_links(acc: dict[str, float], carried: np.ndarray, cap: float, makespan: float) -> None:
    if not len(carried):
        return
    acc["bytes"] += float(carried.sum())
    acc["capacity"] += cap * len(carried)
    acc["peak"] = max(acc.get("peak", 0.0), float(carried.max()) / max(cap * makespan, 1e-30))


def summarize(res: SimResult, df: pd.DataFrame | TraceTable) -> dict[str, Any]:
    makespan = res.makespan
    busy = busy_per_stream(df)
    exp = exposed_per_rank(df)
    topo = res.topology
    links: dict[str, dict[str, float]] = defaultdict(lambda: {"bytes": 0.0, "capacity": 0.0})
    carried = res.link_bytes
    # node links repeat every links_per_node up to trunk_base; leaf-spine trunks come after
    # them and are a class of their own (counting them as node links reported 2,400%)
    for lid in range(topo.links_per_node):
        cls = topo.local_class[lid]
        idx = np.arange(lid, topo.trunk_base, topo.links_per_node)
        _add_links(links[cls], carried[idx], float(topo.local_cap[lid]), makespan)
    trunk = topo.trunk_class
    if trunk is not None and topo.num_trunks:
        idx = np.arange(topo.trunk_base, topo.trunk_base + topo.num_trunks)
        _add_links(links[trunk.name], carried[idx], float(trunk.eff_bw), makespan)
    link_util = {
        c: {
            "bytes": v["bytes"],
            "mean_util": v["bytes"] / max(v["capacity"] * makespan, 1e-30),
            "max_util": v["peak"],
        }
        for c, v in links.items()
        if v["bytes"] > 0
    }
    mem_cap = float(topo.gpu.get("memory_bytes", np.inf))
    peak_mem = float(res.mem_peak.max()) if len(res.mem_peak) else 0.0
    meta = res.graph.meta
    # model states beside the activations, the same for every strategy of a layer (the
    # graph's meta, sim.workload.accounting); a graph without them: unknown (null), not 0
    states = meta.get("model_states")
    state_bytes = float(states["bytes"]) if isinstance(states, dict) else None
    total = None if state_bytes is None else peak_mem + state_bytes
    return {
        "topology": topo.name,
        "nodes": topo.nodes,
        "world_size": res.graph.world_size,
        "strategy": meta.get("strategy"),
        # the strategy's parameters as built (sim.strategies writes them on every graph)
        "params": {k: v for k, v in (meta.get("params") or {}).items() if v is not None}
        | ({"selector": meta["selector"]} if "selector" in meta else {}),
        "passes": meta.get("passes"),
        "makespan_s": makespan,
        "busy_s": busy,
        "exposed_comm_s": float(np.mean(exp)) if exp else 0.0,
        "exposed_comm_max_s": float(np.max(exp)) if exp else 0.0,
        "link_util": link_util,
        "peak_activation_bytes": peak_mem,
        "model_state_bytes": state_bytes,
        "peak_memory_bytes": total,
        "model_states": states if isinstance(states, dict) else None,
        "gpu_memory_bytes": mem_cap,
        # what is known must fit: activations plus model states (activations alone where the
        # graph does not say its model states)
        "oom": (peak_mem if total is None else total) > mem_cap,
        "tokens_per_layer": token_summary(meta),
        "network": res.costs.network,
        "cost_sources": cost_sources(res.costs, meta),
        "fidelity": res.stats.get("fidelity", {}),
        "stats": res.stats,
    } | ({"symmetry": res.stats["symmetry"]} if "symmetry" in res.stats else {})


UNKNOWN = "unknown: the graph's meta does not say (a graph written before moesim recorded it)"
TOKEN_KEYS = ("routed", "kept", "dropped", "dropped_fraction")


def token_summary(meta: dict[str, Any]) -> dict[str, Any]:
    """One MoE layer's (token, expert) assignments routed, kept within capacity and dropped
    (sim.workload.accounting), from the graph's meta; null counts where it has none."""
    t = meta.get("tokens_per_layer")
    if isinstance(t, dict) and all(k in t for k in TOKEN_KEYS):
        return dict(t)
    return {k: None for k in TOKEN_KEYS} | {"policy": None, "scope": UNKNOWN}


def cost_sources(costs: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """Where each fit came from (CostModel.cost_sources), and for PipeMoE's Theorem 1 which
    GEMM and all-to-all fits its selector read (a cluster without measured ones: the
    simulator's own models, so the selector agrees with the simulation by construction)."""
    fn = getattr(costs, "cost_sources", None)
    out: dict[str, Any] = fn() if fn is not None else {}
    sel = meta.get("selector")
    theorem1 = isinstance(sel, dict) and sel.get("selector") == "theorem1"
    if meta.get("strategy") == "pipemoe" and theorem1:
        fits = out.get("compute", {}).get("fits", {})
        gemm = fits.get("gemm") or (
            "derived from the compute model at the layer's chunk GEMMs "
            "(sim.hardware.costs.derived.gemm_fit)"
        )
        a2a = out.get("collectives", {}).get("all_to_all", {}).get("source", "unknown")
        out["pipemoe_selector"] = {"gemm": gemm, "all_to_all": a2a}
    return out


def _known(x: Any) -> bool:
    """A finite number (not None, NaN or pandas' NA)."""
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def work_note(rows: list[dict[str, Any]], names: list[str]) -> str | None:
    """A note line when rows keep different numbers of (token, expert) choices per MoE layer
    (another routing, or a dropless strategy beside capacity-bound ones): their times are not
    for the same work (a skewed routing that drops tokens computes less, so it looks faster).
    Rows are summaries (their `tokens_per_layer`) or table rows (`tokens_kept`,
    `dropped_fraction`); rows whose counts are unknown are left out."""
    seen = []
    for r, name in zip(rows, names):
        t = r.get("tokens_per_layer")
        kept: Any  # numbers as the rows hold them (checked by _known)
        frac: Any
        kept = t.get("kept") if isinstance(t, dict) else r.get("tokens_kept")
        frac = t.get("dropped_fraction") if isinstance(t, dict) else r.get("dropped_fraction")
        if _known(kept) and _known(frac):
            seen.append((name, int(kept), float(frac)))
    if len({k for _, k, _ in seen}) <= 1:
        return None
    each = ", ".join(f"{n} {k:,} ({f:.1%} dropped)" for n, k, f in seen)
    return (
        f"note: rows differ in tokens kept per MoE layer: {each}, so their times are not for "
        "the same work (dropped tokens are not computed)"
    )


def _collective_line(s: dict[str, Any]) -> str | None:
    """Where the collective-level alpha-beta came from, when the run or a selector used it."""
    coll = s.get("cost_sources", {}).get("collectives") or {}
    used = s.get("network") == "collective" or "pipemoe_selector" in s.get("cost_sources", {})
    if not coll or not used:
        return None
    by: dict[str, list[str]] = defaultdict(list)
    for kind, v in sorted(coll.items()):
        by[v["source"]].append(kind)
    parts = []
    for src, kinds in by.items():
        if src.startswith("derived from the flow model"):
            why = (
                " (so --network collective reproduces flow: not an independent model)"
                if s.get("network") == "collective"
                else " (read by PipeMoE's selector; the run itself simulates flows)"
            )
            parts.append(f"derived from the flow model for {', '.join(kinds)}{why}")
        else:
            parts.append(f"{src} for {', '.join(kinds)}")
    return "; ".join(parts)


def _token_line(t: dict[str, Any]) -> str:
    if t.get("routed") is None:
        return "unknown (the graph's meta does not say)"
    rule = f"capacity C={t['capacity']}" if t.get("capacity") else str(t.get("policy"))
    load = t.get("gpu_load_max_mean")
    skew = "" if load is None or load == 1.0 else f"; hottest GPU {load:.2f}x the mean load"
    return (
        f"routed {t['routed']:,}, kept {t['kept']:,}, dropped {t['dropped']:,} "
        f"({t['dropped_fraction']:.1%}) (token, expert) choices ({rule}{skew})"
    )


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"{s['strategy']} {s['params']} on {s['topology']} x{s['nodes']} nodes "
        f"({s['world_size']} GPUs), passes {s['passes']}",
        f"  makespan           {s['makespan_s'] * 1e3:10.3f} ms" + _spread(s),
        f"  exposed comm       {s['exposed_comm_s'] * 1e3:10.3f} ms (mean over ranks; "
        f"max {s['exposed_comm_max_s'] * 1e3:.3f} ms)",
    ]
    for stream, t in sorted(s["busy_s"].items()):
        lines.append(
            f"  busy {stream:13s} {t * 1e3:10.3f} ms ({t / max(s['makespan_s'], 1e-30):6.1%})"
        )
    for cls, u in sorted(s["link_util"].items()):
        lines.append(
            f"  link {cls:13s} {u['mean_util']:6.1%} mean, {u['max_util']:6.1%} busiest "
            f"({u['bytes'] / 1e9:.3f} GB)"
        )
    oom = "  OUT OF MEMORY" if s["oom"] else ""
    gib, cap = 2**30, f"{s['gpu_memory_bytes'] / 2**30:.1f} GiB"
    lines.append(f"  peak activations   {s['peak_activation_bytes'] / gib:10.3f} GiB")
    ms = s.get("model_states")
    if s.get("model_state_bytes") is None or not ms:
        lines.append("  model states             unknown (the graph's meta does not say)")
        lines.append(
            f"  peak memory        {s['peak_activation_bytes'] / gib:10.3f} GiB of {cap}"
            f" (activations only){oom}"
        )
    else:
        per = "+".join(str(v) for v in ms["bytes_per_param"].values() if v)
        what = "weights, gradients, Adam states" if len(per) > 2 else "weights"
        lines.append(
            f"  model states       {s['model_state_bytes'] / gib:10.3f} GiB (gate + experts of "
            f"{ms['moe_layers']} MoE layer(s); {per} B/param: {what})"
        )
        lines.append(f"  peak memory        {s['peak_memory_bytes'] / gib:10.3f} GiB of {cap}{oom}")
    tok = s.get("tokens_per_layer") or {}
    lines.append(f"  tokens per layer   {_token_line(tok)}")
    fid = ", ".join(f"{k}: {v}" for k, v in s["fidelity"].items())
    lines.append(f"  network model      {s['network']} ({fid} collectives)")
    coll = _collective_line(s)
    if coll:
        lines.append(f"  collective costs   {coll}")
    host = s.get("cost_sources", {}).get("host")
    if host:  # ranks sharing one CPU host (sim.hardware.costs.host)
        coll = host.get("collective_factor")
        lines.append(
            f"  shared host        {host['run']}, against {host['reference']}: kernels "
            f"x{host['compute_factor']:.3g}, memory-bound x{host['memory_factor']:.3g}, "
            + ("flows on the topology's links" if coll is None else f"collectives x{coll:.3g}")
        )
        if host.get("warning"):
            lines.append(f"  WARNING: {host['warning']}")
    sel = s.get("cost_sources", {}).get("pipemoe_selector")
    if sel:  # Theorem 1 on fits of the simulator's own models agrees with it by construction
        lines.append(f"  selector fits      PipeMoE's Theorem 1 read GEMM: {sel['gemm']}")
    sym = s.get("symmetry")
    if sym and sym.get("used"):
        lines.append(
            f"  symmetry           {sym['ranks']} ranks as {sym['ranks_simulated']} simulated "
            f"({sym['replicas']} replica(s); node classes: {sym['node_classes']}); rows and "
            f"memory are the first replica's"
        )
    elif sym:
        lines.append(f"  symmetry           not used: {sym['reason']}")
    return "\n".join(lines)


def _spread(s: dict[str, Any]) -> str:
    """With a jitter model: the median run is reported; say over how many and their range."""
    spans = s.get("stats", {}).get("replica_makespans")
    if not spans:
        return ""
    lo, hi = np.percentile(spans, [10, 90]) * 1e3
    return f" (median of {len(spans)} noisy runs; p10-p90 {lo:.3f}-{hi:.3f} ms)"
