"""Start ranks and gather their results: N local processes, or the processes of torchrun.

`launch(graph, nprocs)` runs a task graph on N local processes and returns one trace
DataFrame; `call_ranks(fn, args, nprocs)` is the same machinery for any per-rank function
(exec.layers.moe uses it). Local processes are fresh interpreters (not forks, which would inherit
torch's thread pools; not multiprocessing's spawn, which re-imports the caller's __main__)
and rendezvous through a TCPStore that this process hosts on a port the
OS picks, so two launches never race for a port. Each child reports its result, or its error
message, through a file; as soon as one child fails the others are killed, so a rank stuck
in a collective with a dead peer never outlives the run. exec.runtime.supervise bounds the
start-up, names the rank that failed first (a signal, an exit code), and ties the ranks'
lives to the launcher's.

Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set), `call_under_torchrun` runs the function
on this process's rank and gathers every rank's result to rank 0.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from exec.errors import ExecError, require_torch
from exec.runtime import supervise
from exec.runtime.timeouts import CONTROL_TIMEOUT_S, SETUP_TIMEOUT_S
from sim.core.graph import TaskGraph
from sim.core.kinds import COMM_KINDS

if TYPE_CHECKING:  # pandas and the trace schema load in `assemble`, in the parent only: every
    import pandas as pd  # rank's fresh interpreter imports this module (~0.3 s CPU each)


@dataclass
class ExecResult:
    """A measured run: one trace row per task per rank, times on rank 0's clock."""

    trace: pd.DataFrame
    nprocs: int
    backend: str
    device: str
    clock_offsets_ns: list[int] = field(default_factory=list)
    clock_bounds_ns: list[int] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        if self.trace.empty:
            return 0.0
        return float(self.trace["end"].max() - self.trace["start"].min())


def host_cores() -> int:
    """Cores this process may run on: its CPU affinity where the OS has one (a container or
    `taskset` may allow fewer than the CPU count), else the CPU count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def rank_threads(nprocs: int, given: int | None = None) -> int:
    """torch threads per local rank: `given`, else the cores shared out (at least one)."""
    return given or max(1, host_cores() // max(nprocs, 1))


def oversubscription(nprocs: int, threads: int | None = None) -> str | None:
    """A warning when `nprocs` local ranks of `threads` torch threads each (default: as
    `call_ranks` sets them) outnumber the host's cores, naming the numbers; else None."""
    t, cores = rank_threads(nprocs, threads), host_cores()
    if nprocs * t <= cores:
        return None
    return (
        f"{nprocs} ranks x {t} thread{'s' if t > 1 else ''} per rank = {nprocs * t} threads "
        f"on {cores} core{'s' if cores > 1 else ''}: the ranks share cores (the simulator "
        f"models it as each rank's share of the cores on a topology with shared_cpu, e.g. "
        f"localhost-cpu; measured times are noisier than on cores of their own)"
    )


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def check_world(graph: TaskGraph, nprocs: int) -> None:
    if graph.world_size != nprocs:
        raise ExecError(
            f"the graph is for {graph.world_size} ranks but {nprocs} processes were asked for; "
            f"run it with --nprocs {graph.world_size} (or rebuild the graph for {nprocs} ranks)"
        )


def launch(
    graph: TaskGraph,
    nprocs: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    warmup: int = 1,
    threads_per_rank: int | None = None,
    setup_timeout_s: float | None = None,
) -> ExecResult:
    """Run `graph` on `nprocs` local processes and gather the measured trace."""
    return launch_runs(
        graph, nprocs, 1, backend, timeout_s, warmup, threads_per_rank, setup_timeout_s
    )[0]


def launch_runs(
    graph: TaskGraph,
    nprocs: int,
    runs: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    warmup: int = 1,
    threads_per_rank: int | None = None,
    setup_timeout_s: float | None = None,
) -> list[ExecResult]:
    """`runs` timed runs of `graph` in one launch (one process start per rank, one warm-up):
    one measured trace per run. Repeats in fresh processes cost a process start and a torch
    import each (about 5 s per run on a lent GPU machine's VM host with a CUDA build of torch,
    reports/gpu-h100-80gb-hbm3-2026-11-28), and measure no more of the step."""
    check_world(graph, nprocs)
    per_rank = call_ranks(
        _graph_runs_job,
        (graph, backend, timeout_s, warmup, runs),
        nprocs,
        backend=backend,
        timeout_s=timeout_s,
        threads_per_rank=threads_per_rank,
        setup_timeout_s=setup_timeout_s,
    )
    return [assemble(graph, [r[i] for r in per_rank], backend) for i in range(max(runs, 1))]


def run_under_torchrun(
    graph: TaskGraph, backend: str = "gloo", timeout_s: float = 60.0, warmup: int = 1
) -> ExecResult | None:
    """Run this process's rank of `graph`; rank 0 gets the gathered result, others None."""
    check_world(graph, int(os.environ["WORLD_SIZE"]))
    results = call_under_torchrun(_graph_job, (graph, backend, timeout_s, warmup), backend)
    return None if results is None else assemble(graph, results, backend)


def _graph_job(rank: int, world: int, graph: TaskGraph, backend: str, timeout_s: float, warmup):
    from exec.runtime.runner import run_rank

    return run_rank(graph, rank, backend, None, timeout_s, warmup)


def _graph_runs_job(
    rank: int, world: int, graph: TaskGraph, backend: str, timeout_s: float, warmup, runs: int
):
    from exec.runtime.runner import run_rank_timed

    return run_rank_timed(graph, rank, backend, None, timeout_s, warmup, runs)


def assemble(graph: TaskGraph, results: list, backend: str) -> ExecResult:
    """All ranks' rows as one trace, with sync_wait derived from the aligned start times.

    sync_wait of a communication task = how long after its launch the last member launched
    (clipped to its duration): the part of its time spent waiting for peers, as the
    simulator reports it. Its accuracy is the clock alignment bound.
    """
    import pandas as pd

    from sim.analysis.trace import COLUMNS

    rows = [row for r in results for row in r.rows]
    df = pd.DataFrame(rows, columns=COLUMNS)
    if not df.empty:
        coll = {t.id: t.coll for t in graph if t.kind in COMM_KINDS}
        c = df["id"].map(coll)
        is_comm = c.notna()
        last = df[is_comm].groupby(c[is_comm])["start"].transform("max")
        wait = (last - df.loc[is_comm, "start"]).clip(lower=0.0)
        df.loc[is_comm, "sync_wait"] = np.minimum(wait, df.loc[is_comm, "duration"])
        df = df.sort_values(["rank", "start", "end"], kind="stable").reset_index(drop=True)
    ordered = sorted(results, key=lambda r: r.rank)
    return ExecResult(
        df,
        len(results),
        backend,
        ordered[0].device if ordered else "",
        [r.clock.offset_ns for r in ordered],
        [r.clock.bound_ns for r in ordered],
    )


# -- generic per-rank machinery --------------------------------------------------------------


def call_ranks(
    fn: Callable[..., Any],
    args: tuple,
    nprocs: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    threads_per_rank: int | None = None,
    setup_timeout_s: float | None = None,
) -> list[Any]:
    """Run `fn(rank, world, *args)` in `nprocs` spawned processes with torch.distributed
    initialised; return the per-rank results in rank order, or raise the first rank's error.

    `fn` and `args` must be picklable (fn defined at module level). Every rank must be up
    (process started, torch imported, process group initialised) within `setup_timeout_s`
    (default max(timeout_s, SETUP_TIMEOUT_S)), or the run fails naming the late rank.
    """
    require_torch()
    import torch.distributed as dist

    if nprocs < 1:
        raise ExecError(f"--nprocs must be >= 1, got {nprocs}")
    require_backend(backend)
    threads = rank_threads(nprocs, threads_per_rank)
    setup = max(timeout_s, SETUP_TIMEOUT_S) if setup_timeout_s is None else setup_timeout_s
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        nprocs + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=setup),
    )
    with supervise.run_folder() as tmp, supervise.interruptible():
        out = Path(tmp)
        env = dict(os.environ)
        # the children import sim/exec (and unpickle fn) from wherever this process did
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        # Set before torch loads: every thread's OpenMP / MKL team defaults to this size, so
        # idle team members cannot spin on the cores the other ranks need.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        procs: list[subprocess.Popen] = []
        # the ranks' lifeline: only this process holds the write end (see supervise)
        life_r, life_w = os.pipe()
        try:
            for rank in range(nprocs):
                spec = (rank, nprocs, "127.0.0.1", store.port, backend, timeout_s, threads, out)
                # two pickles: the rank reads its place first, then fn (whose module may be
                # slow to import), so that its `up` mark means "this interpreter runs"
                job = pickle.dumps(spec) + pickle.dumps((fn, args))
                (out / f"rank{rank}.in").write_bytes(job)
                cmd = [sys.executable, "-c", _CHILD_CMD, str(out / f"rank{rank}.in"), str(life_r)]
                procs.append(subprocess.Popen(cmd, env=env, pass_fds=(life_r,)))
            os.close(life_r)
            life_r = -1
            watch = supervise.Supervisor(procs, out, setup)
            failed = watch.wait()
        finally:  # the launcher's own kills: never reported as faults
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            for fd in (life_r, life_w):
                if fd >= 0:
                    os.close(fd)
        if failed:
            raise ExecError(watch.error())
        return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(nprocs)]


# the lifeline's watch starts before anything else: a rank never outlives the launcher
_CHILD_CMD = (
    "import sys; from exec.runtime.supervise import watch_parent; "
    "watch_parent(int(sys.argv[2])); from exec.runtime.launch import _child; _child(sys.argv[1])"
)


def _child(spec_path: str) -> None:
    """Entry point of a rank's process (a fresh interpreter: see call_ranks).

    It leaves with os._exit: a rank whose collective timed out may have gloo threads still
    blocked, and interpreter shutdown would wait for them.
    """
    with open(spec_path, "rb") as f:
        rank, world, host, port, backend, timeout_s, threads, out = pickle.load(f)
        code = 0
        try:
            supervise.mark(out, rank, "up")
            fn, args = pickle.load(f)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            _report(out, rank, e)
            os._exit(1)
    try:
        import torch
        import torch.distributed as dist

        supervise.mark(out, rank, "torch")

        torch.set_num_threads(threads)
        if backend == "nccl":  # before the process group, so NCCL binds to this GPU
            torch.cuda.set_device(rank % torch.cuda.device_count())
        setup = timedelta(seconds=max(timeout_s, SETUP_TIMEOUT_S))
        store = dist.TCPStore(host, port, world + 1, is_master=False, timeout=setup)
        # The default group's timeout stays CONTROL_TIMEOUT_S: on gloo it is the control group
        # (exec.runtime.runner), whose barriers and gathers wait out a whole run on the slowest
        # rank, and gloo applies this one timeout to connecting and to every later operation.
        # Start-up is bounded by the launcher instead: it ends a run whose ranks are not all
        # `ready` within the start-up bound (exec.runtime.supervise).
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=CONTROL_TIMEOUT_S),
        )
        supervise.mark(out, rank, "ready")
        value = fn(rank, world, *args)
        tmp = out / f".rank{rank}.pkl"
        tmp.write_bytes(pickle.dumps(value))
        tmp.replace(out / f"rank{rank}.pkl")
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
        code = 1
        _report(out, rank, e)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _report(out: Path, rank: int, e: BaseException) -> None:
    from sim.core.errors import MoesimError

    if isinstance(e, MoesimError):
        message = str(e)
    else:  # a bug or an unexpected torch error: keep the traceback's last line and the rank
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        message = f"rank {rank}: {last}"
    report = {"rank": rank, "time": time.time(), "message": message}
    tmp = out / f".rank{rank}.err"
    tmp.write_text(json.dumps(report))
    tmp.replace(out / f"rank{rank}.err")


def require_backend(backend: str) -> None:
    """One line instead of a rank's ZeroDivisionError (rank % 0 GPUs) when NCCL has no GPU."""
    if backend not in ("gloo", "nccl"):
        raise ExecError(f"backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            raise ExecError("--backend nccl needs CUDA GPUs; none found (use --backend gloo)")


def call_under_torchrun(fn: Callable[..., Any], args: tuple, backend: str = "gloo") -> list | None:
    """`fn(rank, world, *args)` on this torchrun rank; rank 0 gets every rank's result."""
    require_torch()
    require_backend(backend)
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():  # torchrun's agent, not this module, watches start-up and
        # kills the other workers when one dies; the 24 h is for the control waits (see _child)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        dist.init_process_group(backend, timeout=timedelta(seconds=CONTROL_TIMEOUT_S))
    value = fn(rank, world, *args)
    gathered: list | None = [None] * world if rank == 0 else None
    group = dist.new_group(backend="gloo") if backend != "gloo" else None
    dist.gather_object(value, gathered, dst=0, group=group)
    # Tear the groups down together: a process leaving with live gloo groups while a peer
    # still uses its connections can abort ("terminate called without an active exception").
    dist.barrier(group=group)
    dist.destroy_process_group()
    return gathered
