"""An nccl-tests-style benchmark run in the simulator (`moesim collectives`).

Sizes and bandwidths follow nccl-tests' definitions (doc/PERFORMANCE.md there) so that a row
can be laid next to a real run on the same cluster:
- size: bytes of the per-rank buffer nccl-tests reports (all-gather: the gathered output;
  reduce-scatter: the full input; all-to-all: the whole send buffer), count = size / 4 (float);
- algbw = size / time;
- busbw = algbw x (n-1)/n for all-to-all, all-gather and reduce-scatter, x 2(n-1)/n for
  all-reduce, x 1 for broadcast and sendrecv.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.engine.engine import simulate
from sim.hardware.collectives import algorithms
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology

KINDS = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "sendrecv")
TYPE_BYTES = 4  # nccl-tests' default type, float


def bus_factor(kind: str, n: int) -> float:
    if kind in ("all_to_all", "all_gather", "reduce_scatter"):
        return (n - 1) / n
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    return 1.0


@dataclass
class Row:
    size: int
    count: int
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def graph_for(kind: str, algo: str | None, n: int, size: int) -> TaskGraph:
    """One collective of nccl-tests size `size` on ranks 0..n-1."""
    g = TaskGraph(n, meta={"benchmark": kind, "algo": algo, "size": size})
    group = list(range(n))
    for r in range(n):
        if kind == "sendrecv":  # each rank sends to the next and receives from the previous
            g.add(Task(f"s{r}", r, "comm", "send", peer=(r + 1) % n, bytes=size, coll=f"p{r}"))
            g.add(
                Task(
                    f"r{r}",
                    r,
                    "comm.1",
                    "recv",
                    peer=(r - 1) % n,
                    bytes=size,
                    coll=f"p{(r - 1) % n}",
                )
            )
            continue
        per_rank = size / n if kind == "all_gather" else size  # all-gather: the input shard
        g.add(
            Task(
                f"c{r}",
                r,
                "comm",
                kind,
                bytes=float(per_rank),
                group=group,
                coll="c",
                algo=algo,
                tags={"dtype": "fp32"},
            )
        )
    g.validate()
    return g


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    if lo < 1 or hi < lo or factor < 2:
        raise ConfigError("sizes: need 1 <= min <= max and a step factor >= 2")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def run(
    topo: Topology, costs: CostModel, kind: str, algo: str | None, size_list: list[int]
) -> tuple[list[Row], dict]:
    if kind not in KINDS:
        raise ConfigError(f"collective {kind!r}: expected one of {KINDS}")
    if algo is not None and kind != "sendrecv" and algo not in algorithms(kind):
        raise ConfigError(f"--algo {algo!r}: {kind} has {algorithms(kind)}")
    if costs.network != "flow":
        raise ConfigError("moesim collectives models flows; use costs.network: flow")
    n = topo.world_size
    if n < 2:
        raise ConfigError(f"{topo.name}: a collective benchmark needs at least 2 GPUs")
    rows, fidelity = [], {}
    for size in size_list:
        res = simulate(graph_for(kind, algo, n, size), topo, costs)
        t = res.makespan
        algbw = size / t / 1e9
        rows.append(Row(size, size // TYPE_BYTES, t * 1e6, algbw, algbw * bus_factor(kind, n)))
        for k, v in res.stats["fidelity"].items():
            fidelity[k] = fidelity.get(k, 0) + v
    return rows, fidelity


def format_table(rows: list[Row], header: dict) -> str:
    lines = [
        f"# moesim collectives: {header['collective']} ({header['algo']}) on {header['topology']}"
        f" x{header['nodes']} nodes, {header['gpus']} GPUs; fidelity {header['fidelity']}",
        "#",
        f"# {'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8}",
        f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}",
    ]
    for r in rows:
        lines.append(
            f"  {r.size:>12d} {r.count:>12d} {'float':>6} {r.time_us:>10.2f} "
            f"{r.algbw:>8.2f} {r.busbw:>8.2f}"
        )
    return "\n".join(lines)
