"""Microbenchmarks for calibration, written as task graphs and run by the executor itself.

Measuring through the same runner that executes strategies means the fitted costs include
exactly the overheads a replayed graph pays (thread hand-off, async-op wait, buffer reuse).
The benchmarks measured alone run as one graph (`chain`: one section after the other), so
that process start-up (about a second) is paid three times in all rather than per size:

- GEMMs over a grid of (m, n, k) on the compute stream, in every dtype the device runs
  (bf16, fp16, fp32, tf32 on CUDA; on a CPU every dtype runs as fp32, so fp32 alone, and the
  file's stand_ins say it stands for the others) and in the three operand layouts autograd runs
  (forward "nn", dgrad "nt", wgrad "tn"), and at the exact (batch, m, n, k, dtype, layout)
  shapes of the graphs to be simulated when the plan lists them (Plan.with_shapes_of);
- the memory-bound kernel (what gate / encode / decode / elementwise run as) over sizes;
- host copies (d2h, h2d) over sizes on the copy stream;
- each collective over message sizes on the comm stream (all ranks; with one rank they only
  size the interference measurements: a one-rank collective is a local copy, not fitted);
- each stream kind while the others run beside it (compute beside comm, beside copy, beside
  both; and so on), the victim's operations covered end to end by four times as many of the
  others' (MPipeMoE Sec. II-C, Fig. 3). Rows count as concurrent only when covered for 90% of
  their duration: partly overlapped ones would blur the factor towards 1;
- dispatch latency (sim.hardware.costs.dispatch): how long a ready task waits to start, after its
  stream's previous task (from the runs above) and after a task of another stream (a
  compute -> communication -> compute chain, the MoE layer's rhythm).

`calibrate()` runs them, turns the traces into rows (exec.measure.timings) and fits a Calibration
(estimators a busy host cannot inflate) whose meta says where and under what load it measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from exec.measure.environment import LoadProbe
from exec.measure.sections import chain, run_sections
from exec.measure.timings import dispatch_gaps, measurements
from exec.runtime.launch import launch
from exec.runtime.ops import STAND_INS, run_dtype
from sim.core.graph import Task, TaskGraph
from sim.core.progress import Bar, echo
from sim.hardware.costs.calibration import Calibration
from sim.hardware.costs.compute import shape_key
from sim.hardware.costs.gemm import gemm_layout
from sim.hardware.costs.robust import describe_load

MEMORY_KINDS = ("elementwise", "gate", "encode", "decode", "softmax", "layernorm", "attention")
# what each device runs GEMMs in (the first is the one the overlap measurements use)
DEVICE_DTYPES = {"cuda": ("bf16", "fp16", "fp32", "tf32"), "cpu": ("fp32",)}
AUTOGRAD_LAYOUTS = ("nn", "nt", "tn")  # forward x W, dgrad dy W^T, wgrad x^T dy
ExactShape = tuple[int, int, int, int, str, str]  # batch, m, n, k, dtype, layout


def device_type(backend: str) -> str:
    """gloo runs on the CPU, nccl on GPUs (exec.runtime.runner.default_device)."""
    return "cuda" if backend == "nccl" else "cpu"


@dataclass
class Plan:
    """Sizes to measure; `quick()` is the CI-sized plan."""

    gemms: list[tuple[int, int, int]] = field(
        default_factory=lambda: [
            (m, n, k) for m in (64, 256, 1024) for n, k in ((256, 256), (512, 1024), (1024, 512))
        ]
    )
    # a GPU needs larger GEMMs than a CPU before the time grows with the work
    cuda_gemms: list[tuple[int, int, int]] = field(
        default_factory=lambda: [
            (m, n, k)
            for m in (256, 1024, 4096)
            for n, k in ((1024, 1024), (4096, 2048), (2048, 4096))
        ]
    )
    layouts: tuple[str, ...] = AUTOGRAD_LAYOUTS
    dtypes: tuple[str, ...] | None = None  # None: every dtype the device runs (DEVICE_DTYPES)
    memory_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(16, 27, 2)])
    copy_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(16, 27, 2)])
    comm_bytes: list[int] = field(default_factory=lambda: [2**k for k in range(10, 25, 2)])
    collectives: tuple[str, ...] = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")
    reps: int = 5
    overlap_reps: int = 12
    # (batch, m, n, k, dtype, layout) GEMMs to profile exactly: those of the graphs to be
    # simulated, in the graphs' dtypes (each runs in what the device runs it in)
    gemm_shapes: list[ExactShape] = field(default_factory=list)

    def with_shapes_of(self, graphs: list[TaskGraph]) -> Plan:
        """This plan, also profiling every GEMM shape the graphs run. Empty GEMMs (a skewed
        routing's chunk without tokens: m = 0) run no kernel and are not profiled."""
        shapes: set[ExactShape] = set()
        for g in graphs:
            for t in g:
                if t.kind != "gemm" or not t.shape:
                    continue
                key = shape_key(t.shape)
                if min(key) >= 1:
                    dtype = str(t.tags.get("dtype", "fp32"))
                    shapes.add((*key, dtype, gemm_layout(t.shape)))
        return replace(self, gemm_shapes=sorted(set(self.gemm_shapes) | shapes))

    def dtypes_for(self, device: str) -> tuple[str, ...]:
        return self.dtypes or DEVICE_DTYPES.get(device, ("fp32",))

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            gemms=[(64, 256, 256), (256, 512, 512), (512, 512, 1024)],
            cuda_gemms=[(256, 1024, 1024), (1024, 4096, 2048), (4096, 2048, 4096)],
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

    def add(
        self, stream: str, kind: str, after_previous: bool = False, dtype: str = "fp32", **kw
    ) -> None:
        """One task per rank; `after_previous` makes it depend on the task added before."""
        cid = f"b{self.n}"
        self.n += 1
        for r in range(self.world):
            extra = dict(kw)
            if after_previous and self.n > 1:
                extra["deps"] = [f"r{r}/b{self.n - 2}"]
            if kind in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce"):
                extra.update(group=self.group, coll=cid)
            self.g.add(Task(f"r{r}/{cid}", r, stream, kind, tags={"dtype": dtype}, **extra))

    def done(self) -> TaskGraph:
        self.g.validate()
        return self.g


def gemm_shape(m: int, n: int, k: int, batch: int = 1, layout: str = "nn") -> dict:
    shape: dict[str, Any] = {"batch": batch, "m": m, "n": n, "k": k}
    if layout != "nn":  # "nn" is what a shape without a layout means
        shape["layout"] = layout
    return shape


def gemm_graph(world: int, plan: Plan, device: str = "cpu") -> TaskGraph:
    """The grid in every dtype and layout, then the exact shapes, `reps` times over; each
    task is tagged with the dtype the device really runs it in (exec.runtime.ops.run_dtype)."""
    from sim.hardware.costs.gemm import DTYPE_BYTES

    b = _Builder(world, "gemm")
    grid = plan.cuda_gemms if device == "cuda" else plan.gemms
    todo: list[ExactShape] = [
        (1, m, n, k, dt, lay)
        for dt in plan.dtypes_for(device)
        for lay in plan.layouts
        for m, n, k in grid
    ]
    todo += [(*s[:4], run_dtype(s[4], device), s[5]) for s in plan.gemm_shapes]
    for _ in range(plan.reps):
        for bt, m, n, k, dt, lay in todo:
            b.add(
                "compute",
                "gemm",
                dtype=dt,
                shape=gemm_shape(m, n, k, bt, lay),
                flops=2.0 * bt * m * n * k,
                bytes=float(DTYPE_BYTES[dt] * bt * (m * k + k * n + m * n)),
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


def _overlap_sizes(cal: Calibration, target_s: float, dtype: str) -> dict[str, dict]:
    """One operation per stream kind whose alone time is about `target_s` (the GEMM in
    `dtype`; `cal` fitted with its one-rank collectives, which only size the exchange here)."""

    def invert(op: str, ranks: int, lo: float, hi: float, dt: str | None = None) -> float:
        for _ in range(60):  # bisection on the monotone fitted model
            mid = (lo * hi) ** 0.5
            pred = cal.predict(op, ranks, mid, dt)
            lo, hi = (mid, hi) if pred is not None and pred < target_s else (lo, mid)
        return hi

    world = max((int(f["ranks"]) for f in cal.collectives.get("all_to_all", [])), default=2)
    side = int(round(invert("gemm", 1, 1e3, 1e13, dtype) ** (1 / 3)))
    elem = 2 if dtype in ("bf16", "fp16") else 4
    return {
        "compute": {
            "kind": "gemm",
            "dtype": dtype,
            "shape": gemm_shape(side, side, side),
            "flops": 2.0 * side**3,
            "bytes": 3.0 * elem * side * side,
        },
        "comm": {"kind": "all_to_all", "bytes": invert("all_to_all", world, 1e3, 1e9)},
        "copy": {"kind": "d2h", "bytes": invert("d2h", 1, 1e3, 1e9)},
    }


def calibrate(
    nprocs: int,
    backend: str = "gloo",
    plan: Plan | None = None,
    timeout_s: float = 120.0,
    log: Callable[[str], None] = echo,
) -> tuple[Calibration, pd.DataFrame]:
    """Measure, fit, and return the calibration with all measurement rows (a bar of the
    launches on stderr while progress is on; the host's load sampled between them)."""
    probe = LoadProbe()
    with Bar(3, "calibrate", "launch") as bar:
        plan = plan or Plan()
        dev = device_type(backend)
        sections = {
            "gemm": gemm_graph(nprocs, plan, dev),
            "memory": memory_graph(nprocs, plan),
            "copy": copy_graph(nprocs, plan),
            "comm": comm_graph(nprocs, plan),
        }
        g = chain(sections)
        res, env, issues = run_sections(g, nprocs, backend, timeout_s, MEMORY_KINDS)
        probe.sample()
        bar.update()
        bench = res.trace["id"].str.split(":", n=1).str[0]
        rows, gaps = [], []
        for name in sections:
            part = res.trace[bench == name]
            m = measurements(g, part).assign(bench=name)
            rows.append(m)
            gaps.append(dispatch_gaps(g, part).assign(bench=name))
            span = float(part["end"].max() - part["start"].min()) if len(part) else 0.0
            log(f"  measured {name:7s} {len(m):5d} rows in {span:7.3f} s")
        alone = pd.concat(rows, ignore_index=True)
        main_dtype = plan.dtypes_for(dev)[0]
        first = Calibration.fit(alone, local_collectives=True)  # only to size the overlap runs
        gemm_fit = first.fit_of("gemm", main_dtype) or {"alpha": 0.0}
        target = 4 * max(gemm_fit["alpha"], 1e-3)
        sizes = _overlap_sizes(first, target, main_dtype)
        g = overlap_graph(nprocs, plan, sizes)
        res = launch(g, nprocs, backend, timeout_s)
        bar.update()
        over = measurements(g, res.trace, overlap=COVERED).assign(bench="overlap")
        # keep the sized operations under overlap, not the markers between the combinations nor
        # the edges of a combination that happened to run alone (the alone fits come from above)
        over = over[over["op"].isin([v["kind"] for v in sizes.values()]) & (over["others"] != "")]
        log(f"  measured overlap {len(over):5d} rows in {res.makespan:7.3f} s")
        g = handoff_graph(nprocs, plan, sizes)
        res = launch(g, nprocs, backend, timeout_s)
        bar.update()
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
        log(f"  host while measuring: {describe_load(load := probe.result())}")
        meta = {
            "backend": backend,
            "nprocs": nprocs,
            "device": str(res.device),
            **env,
            "dtypes": list(plan.dtypes_for(dev)),
            # graph dtypes this device runs as another: the fits of the one stand for the other
            "stand_ins": dict(STAND_INS.get(dev, {})),
            "rows": len(allrows),
            "load": load,
        }
        cal = Calibration.fit(
            fit_rows, meta=meta, gaps=gap_rows, issues=issues if len(issues) else None
        )
        return cal, allrows
