"""Microbenchmarks for calibration, written as task graphs and run by the executor itself.

Measuring through the same runner that executes strategies means the fitted costs include
exactly the overheads a replayed graph pays (thread hand-off, async-op wait, buffer reuse).
Each benchmark is one graph per category, so that process start-up (about a second) is paid
a handful of times rather than per size:

- GEMMs over a grid of (m, n, k) on the compute stream, and at the exact (batch, m, n, k)
  shapes of the graphs to be simulated when the plan lists them (Plan.with_shapes_of);
- the memory-bound kernel (what gate / encode / decode / elementwise run as) over sizes;
- host copies (d2h, h2d) over sizes on the copy stream;
- each collective over message sizes on the comm stream (all ranks);
- each stream kind while the others run beside it (compute beside comm, beside copy, beside
  both; and so on), the victim's operations covered end to end by four times as many of the
  others' (MPipeMoE Sec. II-C, Fig. 3). Rows count as concurrent only when covered for 90% of
  their duration: partly overlapped ones would blur the factor towards 1;
- dispatch latency (sim.hardware.costs.dispatch): how long a ready task waits to start, after its
  stream's previous task (from the runs above) and after a task of another stream (a
  compute -> communication -> compute chain, the MoE layer's rhythm).

`calibrate()` runs them, turns the traces into measurement rows (exec.measure.timings) and fits a
sim.hardware.costs.calibration.Calibration.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pandas as pd

from exec.measure.timings import dispatch_gaps, measurements
from exec.runtime.launch import launch
from sim.core.graph import Task, TaskGraph
from sim.hardware.costs.calibration import Calibration
from sim.hardware.costs.compute import shape_key

MEMORY_KINDS = ("elementwise", "gate", "encode", "decode", "softmax", "layernorm", "attention")


@dataclass
class Plan:
    """Sizes to measure; `quick()` is the CI-sized plan."""

    gemms: list[tuple[int, int, int]] = field(
        default_factory=lambda: [
            (m, n, k) for m in (64, 256, 1024) for n, k in ((256, 256), (512, 1024), (1024, 512))
        ]
    )
    memory_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(16, 27, 2)])
    copy_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(16, 27, 2)])
    comm_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(10, 25, 2)])
    collectives: tuple[str, ...] = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")
    reps: int = 5
    overlap_reps: int = 12
    # (batch, m, n, k) GEMMs to profile exactly: those of the graphs to be simulated
    gemm_shapes: list[tuple[int, int, int, int]] = field(default_factory=list)

    def with_shapes_of(self, graphs: list[TaskGraph]) -> Plan:
        """This plan, also profiling every GEMM shape the graphs run."""
        shapes = {shape_key(t.shape) for g in graphs for t in g if t.kind == "gemm" and t.shape}
        return replace(self, gemm_shapes=sorted(set(self.gemm_shapes) | shapes))

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            gemms=[(64, 256, 256), (256, 512, 512), (512, 512, 1024)],
            memory_bytes=[2**16, 2**20, 2**23],
            copy_bytes=[2**16, 2**20, 2**23],
            comm_bytes=[2**10, 2**18, 2**22],  # wide enough that the slope beats noise
            collectives=("all_to_all",),
            reps=3,
            overlap_reps=4,
        )


class _Builder:
    """Adds tasks to a graph on every rank with unique ids and collective ids."""

    def __init__(self, world: int, name: str):
        self.g = TaskGraph(world, meta={"benchmark": name})
        self.world = world
        self.group = list(range(world))
        self.n = 0

    def add(self, stream: str, kind: str, after_previous: bool = False, **kw) -> None:
        """One task per rank; `after_previous` makes it depend on the task added before."""
        cid = f"b{self.n}"
        self.n += 1
        for r in range(self.world):
            extra = dict(kw)
            if after_previous and self.n > 1:
                extra["deps"] = [f"r{r}/b{self.n - 2}"]
            if kind in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce"):
                extra.update(group=self.group, coll=cid)
            self.g.add(Task(f"r{r}/{cid}", r, stream, kind, tags={"dtype": "fp32"}, **extra))

    def done(self) -> TaskGraph:
        self.g.validate()
        return self.g


def gemm_shape(m: int, n: int, k: int, batch: int = 1) -> dict:
    return {"batch": batch, "m": m, "n": n, "k": k}


def gemm_graph(world: int, plan: Plan) -> TaskGraph:
    b = _Builder(world, "gemm")
    for _ in range(plan.reps):
        for bt, m, n, k in [(1, *s) for s in plan.gemms] + list(plan.gemm_shapes):
            b.add(
                "compute",
                "gemm",
                shape=gemm_shape(m, n, k, bt),
                flops=2.0 * bt * m * n * k,
                bytes=4.0 * bt * (m * k + k * n + m * n),
            )
    return b.done()


def memory_graph(world: int, plan: Plan) -> TaskGraph:
    b = _Builder(world, "memory")
    for _ in range(plan.reps):
        for nbytes in plan.memory_bytes:
            b.add("compute", "elementwise", bytes=float(nbytes))
    return b.done()


def copy_graph(world: int, plan: Plan) -> TaskGraph:
    b = _Builder(world, "copy")
    for _ in range(plan.reps):
        for nbytes in plan.copy_bytes:
            for kind in ("d2h", "h2d"):
                b.add("copy", kind, bytes=float(nbytes))
    return b.done()


def comm_graph(world: int, plan: Plan) -> TaskGraph:
    b = _Builder(world, "comm")
    for _ in range(plan.reps):
        for kind in plan.collectives:
            for nbytes in plan.comm_bytes:
                b.add("comm", kind, bytes=float(nbytes))
    return b.done()


# (victim stream, streams running beside it): each victim operation should be covered by
# the others from start to end, so they run four times as many operations.
COMBOS = (
    ("compute", ("comm",)),
    ("compute", ("copy",)),
    ("compute", ("comm", "copy")),
    ("comm", ("compute",)),
    ("comm", ("copy",)),
    ("comm", ("compute", "copy")),
    ("copy", ("compute",)),
    ("copy", ("comm",)),
    ("copy", ("compute", "comm")),
)
COVER = 4
COVERED = 0.9  # a row counts as "ran beside X" when X overlapped 90% of its duration


def overlap_graph(world: int, plan: Plan, sizes: dict[str, dict]) -> TaskGraph:
    """Per combination, the victim stream runs `overlap_reps` operations while the other
    streams run COVER times as many; a 4-byte all_reduce ends each combination and the other
    streams wait for it, so that the next combination starts together."""
    b = _Builder(world, "overlap")
    for victim, others in COMBOS:
        for stream in (victim, *others):
            reps = plan.overlap_reps * (1 if stream == victim else COVER)
            for _ in range(reps):
                s = sizes[stream]
                b.add(stream, s["kind"], **{k: v for k, v in s.items() if k != "kind"})
        b.add("comm", "all_reduce", bytes=4.0)
        end = f"b{b.n - 1}"
        for stream in ("compute", "copy"):
            for r in range(world):
                b.g.add(
                    Task(
                        f"r{r}/{end}.sync.{stream}",
                        r,
                        stream,
                        "elementwise",
                        bytes=0.0,
                        deps=[f"r{r}/{end}"],
                        tags={"dtype": "fp32"},
                    )
                )
    return b.done()


def handoff_graph(world: int, plan: Plan, sizes: dict[str, dict]) -> TaskGraph:
    """The MoE layer's rhythm: compute, then communication that needs it, then compute that
    needs that, ... Every task waits on the one before it on the other stream, so each start
    measures a cross-stream hand-off (sim.hardware.costs.dispatch)."""
    b = _Builder(world, "handoff")
    for _ in range(plan.overlap_reps * 2):
        for stream in ("compute", "comm"):
            s = sizes[stream]
            b.add(stream, s["kind"], True, **{k: v for k, v in s.items() if k != "kind"})
    return b.done()


def _overlap_sizes(cal: Calibration, target_s: float) -> dict[str, dict]:
    """One operation per stream kind whose alone time is about `target_s`."""

    def invert(op: str, ranks: int, lo: float, hi: float) -> float:
        for _ in range(60):  # bisection on the monotone fitted model
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if cal.predict(op, ranks, mid) < target_s else (lo, mid)
        return hi

    world = max((f["ranks"] for f in cal.collectives.get("all_to_all", [])), default=2)
    side = int(round(invert("gemm", 1, 1e3, 1e13) ** (1 / 3)))
    return {
        "compute": {
            "kind": "gemm",
            "shape": gemm_shape(side, side, side),
            "flops": 2.0 * side**3,
            "bytes": 12.0 * side * side,
        },
        "comm": {"kind": "all_to_all", "bytes": invert("all_to_all", world, 1e3, 1e9)},
        "copy": {"kind": "d2h", "bytes": invert("d2h", 1, 1e3, 1e9)},
    }


def calibrate(
    nprocs: int,
    backend: str = "gloo",
    plan: Plan | None = None,
    timeout_s: float = 120.0,
    log: Callable[[str], None] = print,
) -> tuple[Calibration, pd.DataFrame]:
    """Measure, fit, and return the calibration with all measurement rows."""
    plan = plan or Plan()
    rows, gaps = [], []
    device = ""
    for name, make in (
        ("gemm", gemm_graph),
        ("memory", memory_graph),
        ("copy", copy_graph),
        ("comm", comm_graph),
    ):
        g = make(nprocs, plan)
        res = launch(g, nprocs, backend, timeout_s)
        device = res.device
        m = measurements(g, res.trace).assign(bench=name)
        rows.append(m)
        gaps.append(dispatch_gaps(g, res.trace).assign(bench=name))
        log(f"  measured {name:7s} {len(m):5d} rows in {res.makespan:7.3f} s")
    alone = pd.concat(rows, ignore_index=True)
    first = Calibration.fit(alone)
    target = 4 * max(first.compute["gemm"]["alpha"], 1e-3)
    sizes = _overlap_sizes(first, target)
    g = overlap_graph(nprocs, plan, sizes)
    res = launch(g, nprocs, backend, timeout_s)
    over = measurements(g, res.trace, overlap=COVERED).assign(bench="overlap")
    # keep the sized operations under overlap, not the markers between the combinations nor
    # the edges of a combination that happened to run alone (the alone fits come from above)
    over = over[over["op"].isin([v["kind"] for v in sizes.values()]) & (over["others"] != "")]
    log(f"  measured overlap {len(over):5d} rows in {res.makespan:7.3f} s")
    g = handoff_graph(nprocs, plan, sizes)
    res = launch(g, nprocs, backend, timeout_s)
    handoff = dispatch_gaps(g, res.trace).assign(bench="handoff")
    log(f"  measured handoff {len(handoff):5d} gaps in {res.makespan:7.3f} s")
    # cross-stream gaps from the hand-off chain; same-stream gaps from the back-to-back runs
    # of one kind (the overlap graph's gaps mix both with its end-of-combination markers)
    gap_rows = pd.concat(
        [*(x[x["via"] == "stream"] for x in gaps), handoff[handoff["via"] == "cross"]],
        ignore_index=True,
    )
    allrows = pd.concat([alone, over], ignore_index=True)
    # the memory-bound stand-in is one kernel for every such kind (exec.runtime.ops)
    mem = allrows["op"] == "elementwise"
    aliases = [allrows[mem].assign(op=k) for k in MEMORY_KINDS[1:]]
    fit_rows = pd.concat([allrows, *aliases], ignore_index=True)
    meta = {
        "backend": backend,
        "nprocs": nprocs,
        "device": device,
        "host": platform.node(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "rows": len(allrows),
    }
    return Calibration.fit(fit_rows, meta=meta, gaps=gap_rows), allrows
