"""An nccl-tests-style benchmark run in the simulator (`moesim collectives`).

Sizes and bandwidths follow nccl-tests' definitions (doc/PERFORMANCE.md there) so that a row
can be laid next to a real run on the same cluster:
- size: bytes of the per-rank buffer nccl-tests reports (all-gather: the gathered output;
  reduce-scatter: the full input; all-to-all: the whole send buffer); `Row.count` = size / 4
  (float), while the printed table's count is nccl-tests' own (`nccl_count`: one rank's
  share for all-to-all, all-gather and reduce-scatter);
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
) -> tuple[list[Row], dict[str, int]]:
    if kind not in KINDS:
        raise ConfigError(f"collective {kind!r}: expected one of {KINDS}")
    if algo is not None and kind == "sendrecv":  # one algorithm: an ignored --algo misleads
        raise ConfigError(f"--algo {algo!r}: sendrecv has no algorithms to choose from")
    if algo is not None and kind != "sendrecv" and algo not in algorithms(kind):
        raise ConfigError(f"--algo {algo!r}: {kind} has {algorithms(kind)}")
    if costs.network != "flow":
        raise ConfigError("moesim collectives models flows; use costs.network: flow")
    n = topo.world_size
    if n < 2:
        raise ConfigError(f"{topo.name}: a collective benchmark needs at least 2 GPUs")
    rows: list[Row] = []
    fidelity: dict[str, int] = {}
    for size in size_list:
        res = simulate(graph_for(kind, algo, n, size), topo, costs)
        t = res.makespan
        algbw = size / t / 1e9
        rows.append(Row(size, size // TYPE_BYTES, t * 1e6, algbw, algbw * bus_factor(kind, n)))
        for k, v in res.stats["fidelity"].items():
            fidelity[k] = fidelity.get(k, 0) + v
    return rows, fidelity


# nccl-tests' text output, as printed up to nccl-tests 2.17 (src/common.cu before its JSON
# rework of 2025-10), the layout of nearly every published log: "#wrong" one space after
# "busbw" in the header, rows "%12li  %12li  %8s  %6s  %6s" then per placement
# "  %7s  %6.2f  %6.2f  %5s". Reproduced column for column so that `diff` or `paste` against a
# real log lines up.
REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce")
PER_PEER_COUNT = ("all_to_all", "all_gather", "reduce_scatter")  # count is per rank's share
MAX_DEVICE_LINES = 64  # nccl-tests lists every rank; past this the rest are one summary line
_PLACEMENTS = "           out-of-place                       in-place"
COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")


def redop(kind: str) -> str:
    """nccl-tests' redop column: its default `-o sum` for reductions, "none" otherwise."""
    return "sum" if kind in REDUCTIONS else "none"


def root(kind: str) -> int:
    """nccl-tests' root column: rank 0 (its default `-r 0`) where there is a root, else -1."""
    return 0 if kind in ROOTED else -1


def nccl_count(kind: str, n: int, size: int) -> int:
    """nccl-tests' count column: the element count passed to NCCL, which for all-to-all,
    all-gather and reduce-scatter is one rank's share (size / 4 / n), not the whole buffer
    (`Row.count`, kept as size / 4 for the JSON). nccl-tests also rounds that share down to
    16 bytes and shrinks `size` to match; the simulator runs `size` exactly, so it does not."""
    elements = size // TYPE_BYTES
    return elements // n if kind in PER_PEER_COUNT else elements


def _time(us: float) -> str:
    """nccl-tests' time field: fewer decimals as it grows, so that it stays 7 wide."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def avg_busbw(rows: list[Row]) -> float:
    """nccl-tests' "Avg bus bandwidth": the mean busbw over every out-of-place and in-place
    measurement; the simulated in-place run equals the out-of-place one, so the rows' mean."""
    return sum(r.busbw for r in rows) / len(rows) if rows else 0.0


def format_table(rows: list[Row], header: dict, setup: dict | None = None) -> str:
    """nccl-tests' report for `rows`: its run line, devices, two-line column header, one line
    per size with out-of-place and in-place results, and its footer. `header` is the sweep's
    (collective, algo, topology, nodes, gpus, fidelity); `setup` what nccl-tests' header also
    shows (min_bytes, max_bytes, factor, gpus_per_node, gpu_model), derived from the rows
    where absent."""
    setup = setup or {}
    kind, n = header["collective"], header["gpus"]
    sizes_ = [r.size for r in rows]
    lo = setup.get("min_bytes", min(sizes_, default=0))
    hi = setup.get("max_bytes", max(sizes_, default=0))
    factor = setup.get("factor", sizes_[1] // sizes_[0] if len(sizes_) > 1 else 2)
    per_node = setup.get("gpus_per_node", n)
    model = setup.get("gpu_model") or "gpu"
    lines = [
        f"# moesim collectives: {kind} ({header['algo']}) on {header['topology']}"
        f" x{header['nodes']} nodes, {n} GPUs; fidelity {header['fidelity']}",
        # one simulated run per size: nothing to warm up, no run-to-run noise to average, and
        # no data to check (validation 0, so #wrong is N/A as nccl-tests prints it with -c 0)
        f"# nThread 1 nGpus 1 minBytes {lo} maxBytes {hi} step: {factor}(factor)"
        " warmup iters: 0 iters: 1 agg iters: 1 validation: 0 graph: 0",
        "#",
        "# Using devices",
    ]
    # nccl-tests' device line with the simulated cluster in it: node as host, local index as
    # device; no process or PCI address exists, so those fields are zero
    for rank in range(min(n, MAX_DEVICE_LINES)):
        host = f"node{rank // per_node}"
        lines.append(
            f"#  Rank {rank:2d} Group  0 Pid {0:6d} on {host:>10s} device {rank % per_node:2d}"
            f" [0000:00:00] {model} (simulated, {header['topology']})"
        )
    if n > MAX_DEVICE_LINES:
        lines.append(f"#  ... ranks {MAX_DEVICE_LINES} to {n - 1} likewise")
    blank = f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}"
    lines += [
        "#",
        blank + _PLACEMENTS,
        f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}"
        + f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}" * 2,
        # nccl-tests pads this line's end with spaces; stripped here, as a diff ignores them
        (
            f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}"
            + f"  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>5s}" * 2
        ).rstrip(),
    ]
    for r in rows:
        # in-place: the simulator models no buffer placement, so it repeats out-of-place
        result = f"  {_time(r.time_us)}  {r.algbw:6.2f}  {r.busbw:6.2f}  {'N/A':>5s}"
        lines.append(
            f"{r.size:12d}  {nccl_count(kind, n, r.size):12d}  {'float':>8s}"
            f"  {redop(kind):>6s}  {root(kind):6d}" + result * 2
        )
    lines += [
        "# Out of bounds values : 0 OK",
        f"# Avg bus bandwidth    : {avg_busbw(rows):g}",
        "#",
    ]
    return "\n".join(lines)
