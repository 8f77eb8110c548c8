"""Start ranks and gather their results: N local processes, or the processes of torchrun.

`launch(graph, nprocs)` runs a task graph on N local processes and returns one trace
DataFrame; `call_ranks(fn, args, nprocs)` is the same machinery for any per-rank function
(exec.layers.moe uses it). Local processes are fresh interpreters (not forks, which would inherit
torch's thread pools; not multiprocessing's spawn, which re-imports the caller's __main__)
and rendezvous through a TCPStore that this process hosts on a port the
OS picks, so two launches never race for a port. Each child reports its result, or its error
message, through a file; as soon as one child fails the others are killed, so a rank stuck
in a collective with a dead peer never outlives the run.

Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set), `call_under_torchrun` runs the function
on this process's rank and gathers every rank's result to rank 0.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from exec.errors import ExecError, require_torch
from exec.runtime.timeouts import CONTROL_TIMEOUT_S, SETUP_TIMEOUT_S
from sim.core.graph import TaskGraph
from sim.core.kinds import COMM_KINDS

if TYPE_CHECKING:  # pandas and the trace schema load in `assemble`, in the parent only: every
    import pandas as pd  # rank's fresh interpreter imports this module (~0.3 s CPU each)

_GRACE_S = 1.0  # after one rank fails, how long the others get to report their own error


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
) -> ExecResult:
    """Run `graph` on `nprocs` local processes and gather the measured trace."""
    check_world(graph, nprocs)
    results = call_ranks(
        _graph_job,
        (graph, backend, timeout_s, warmup),
        nprocs,
        backend=backend,
        timeout_s=timeout_s,
        threads_per_rank=threads_per_rank,
    )
    return assemble(graph, results, backend)


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
) -> list[Any]:
    """Run `fn(rank, world, *args)` in `nprocs` spawned processes with torch.distributed
    initialised; return the per-rank results in rank order, or raise the first rank's error.

    `fn` and `args` must be picklable (fn defined at module level).
    """
    require_torch()
    import torch.distributed as dist

    if nprocs < 1:
        raise ExecError(f"--nprocs must be >= 1, got {nprocs}")
    require_backend(backend)
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // nprocs)
    setup = max(timeout_s, SETUP_TIMEOUT_S)
    store = dist.TCPStore(
        "127.0.0.1", 0, nprocs + 1, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=setup),
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="moesim-exec-") as tmp:
        out = Path(tmp)
        env = dict(os.environ)
        # the children import sim/exec (and unpickle fn) from wherever this process did
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        # Set before torch loads: every thread's OpenMP / MKL team defaults to this size, so
        # idle team members cannot spin on the cores the other ranks need.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        procs = []
        try:
            for rank in range(nprocs):
                spec = (rank, nprocs, "127.0.0.1", store.port, backend, timeout_s, threads, out)
                (out / f"rank{rank}.in").write_bytes(pickle.dumps(spec + (fn, args)))
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _CHILD_CMD, str(out / f"rank{rank}.in")], env=env
                    )
                )
            failed_at = _supervise(procs, out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
        if failed_at is not None:
            raise _first_error(procs, out)
        return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(nprocs)]


def _supervise(procs: list, out: Path) -> float | None:
    """Wait for every child; on the first failure give the others a moment, then stop.
    Where someone watches (sim.core.progress), a bar of finished ranks whose elapsed time
    keeps moving, so a run of minutes is never silent."""
    from sim.core import progress

    failed_at: float | None = None
    with progress.Bar(len(procs), "exec", "rank") as bar:
        drawn = time.monotonic()
        while True:
            codes = [p.poll() for p in procs]
            if failed_at is None and (
                any(c not in (None, 0) for c in codes) or any(out.glob("rank*.err"))
            ):
                failed_at = time.monotonic()
            bar.set(sum(c is not None for c in codes))
            if time.monotonic() - drawn >= progress.REFRESH_S:
                drawn = time.monotonic()
                bar.refresh()
            if all(c is not None for c in codes):
                return failed_at
            if failed_at is not None and time.monotonic() - failed_at > _GRACE_S:
                return failed_at
            time.sleep(0.02)


def _first_error(procs: list, out: Path) -> ExecError:
    reports = []
    for f in out.glob("rank*.err"):
        try:
            reports.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if reports:
        first = min(reports, key=lambda r: r["time"])
        return ExecError(first["message"])
    codes = {i: p.returncode for i, p in enumerate(procs) if p.returncode not in (None, 0)}
    return ExecError(f"rank(s) exited without a report (exit codes {codes})")


_CHILD_CMD = "import sys; from exec.runtime.launch import _child; _child(sys.argv[1])"


def _child(spec_path: str) -> None:
    """Entry point of a rank's process (a fresh interpreter: see call_ranks).

    It leaves with os._exit: a rank whose collective timed out may have gloo threads still
    blocked, and interpreter shutdown would wait for them.
    """
    rank, world, host, port, backend, timeout_s, threads, out, fn, args = pickle.loads(
        Path(spec_path).read_bytes()
    )
    code = 0
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if backend == "nccl":  # before the process group, so NCCL binds to this GPU
            torch.cuda.set_device(rank % torch.cuda.device_count())
        setup = timedelta(seconds=max(timeout_s, SETUP_TIMEOUT_S))
        store = dist.TCPStore(host, port, world + 1, is_master=False, timeout=setup)
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=CONTROL_TIMEOUT_S),
        )
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
    if not dist.is_initialized():
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
