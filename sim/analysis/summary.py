"""What a run comes down to: makespan, stream busy time, exposed communication, links, memory."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from sim.engine.engine import SimResult


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


def exposed_per_rank(df: pd.DataFrame) -> list[float]:
    """Exposed communication of every rank (plain arrays: a groupby per rank is too slow
    at thousands of ranks)."""
    kind = df["stream"].str.split(".").str[0].to_numpy()
    rank = df["rank"].to_numpy()
    iv = df[["start", "end"]].to_numpy()
    order = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.diff(rank[order])) + 1
    out = []
    for idx in np.split(order, bounds) if len(order) else []:
        k = kind[idx]
        out.append(exposed(iv[idx[k == "comm"]], iv[idx[k == "compute"]]))
    return out


def busy_per_stream(df: pd.DataFrame) -> dict[str, float]:
    """Mean busy time of each stream over the ranks that have it. A stream runs one task at a
    time (program order), so its busy time is the sum of its tasks' durations."""
    per = df.groupby("stream").agg(total=("duration", "sum"), ranks=("rank", "nunique"))
    return {str(k): float(r.total) / r.ranks for k, r in per.iterrows()}


def _add_links(acc: dict[str, float], carried: np.ndarray, cap: float, makespan: float) -> None:
    if not len(carried):
        return
    acc["bytes"] += float(carried.sum())
    acc["capacity"] += cap * len(carried)
    acc["peak"] = max(acc.get("peak", 0.0), float(carried.max()) / max(cap * makespan, 1e-30))


def summarize(res: SimResult, df: pd.DataFrame) -> dict[str, Any]:
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
    return {
        "topology": topo.name,
        "nodes": topo.nodes,
        "world_size": res.graph.world_size,
        "strategy": meta.get("strategy"),
        "params": {
            k: meta[k]
            for k in ("degree", "order", "algo", "parallel", "tp", "group_size", "shadow", "reuse")
            if meta.get(k) is not None
        }
        | ({"selector": meta["selector"]} if "selector" in meta else {}),
        "passes": meta.get("passes"),
        "makespan_s": makespan,
        "busy_s": busy,
        "exposed_comm_s": float(np.mean(exp)) if exp else 0.0,
        "exposed_comm_max_s": float(np.max(exp)) if exp else 0.0,
        "link_util": link_util,
        "peak_activation_bytes": peak_mem,
        "gpu_memory_bytes": mem_cap,
        "oom": peak_mem > mem_cap,
        "network": res.costs.network,
        "fidelity": res.stats.get("fidelity", {}),
        "stats": res.stats,
    } | ({"symmetry": res.stats["symmetry"]} if "symmetry" in res.stats else {})


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
    lines.append(
        f"  peak activations   {s['peak_activation_bytes'] / 2**30:10.3f} GiB of "
        f"{s['gpu_memory_bytes'] / 2**30:.1f} GiB{oom}"
    )
    fid = ", ".join(f"{k}: {v}" for k, v in s["fidelity"].items())
    lines.append(f"  network model      {s['network']} ({fid} collectives)")
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
