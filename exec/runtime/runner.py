"""Run one rank of a TaskGraph for real and time every task.

CPU (gloo): each stream of this rank is a host thread that runs its tasks in program order,
kept for every run of the graph (exec.runtime.host_streams says how and why).

CUDA (nccl): each stream is a torch.cuda.Stream; one host thread issues every task of this
rank in a topological order of the *whole* graph that every rank computes identically, so
communicators are launched in the same order everywhere (concurrent NCCL communicators
launched in different orders deadlock). Cross-stream dependencies are CUDA events; task times
are CUDA events converted to the host clock through one reference event. A task with
`host_sync` (split sizes read on the host) blocks the issuing thread until it has finished,
as the simulator's launch thread does (sim.engine.launch). On the CPU every stream is its own
thread, so a host sync holds back only its own stream's later tasks.

Times: host perf_counter_ns (or CUDA events), moved onto rank 0's clock with the offsets from
exec.runtime.clock, relative to a common origin (the earliest rank's start mark), in seconds.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from exec.errors import ExecError
from exec.runtime.channels import create_groups, plan_channels
from exec.runtime.clock import ClockSync, sync_clocks
from exec.runtime.host_streams import HostStreams, comm_failure, one_line
from exec.runtime.ops import Op, OpFactory
from exec.runtime.timeouts import CONTROL_TIMEOUT_S, SETUP_TIMEOUT_S
from sim.analysis.trace import COLUMNS, TAGS
from sim.core.graph import TaskGraph
from sim.core.kinds import COMM_KINDS


@dataclass
class RankResult:
    """One rank's measured run: trace rows (sim.analysis.trace.COLUMNS) and how its clock
    was aligned."""

    rank: int
    rows: list[dict[str, Any]]
    clock: ClockSync
    device: str
    extra: dict[str, Any] = field(default_factory=dict)


def default_device(backend: str) -> torch.device:
    """gloo runs on the CPU; nccl on this process's current GPU (set by the launcher)."""
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ExecError("backend nccl needs CUDA GPUs; this machine has none (use gloo)")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def run_rank(
    graph: TaskGraph,
    rank: int,
    backend: str = "gloo",
    device: torch.device | str | None = None,
    timeout_s: float = 60.0,
    warmup: int = 1,
    clock_rounds: int = 8,
) -> RankResult:
    """Execute this rank's tasks of `graph` and return their measured trace rows.

    Collective over the world: every rank calls it with the same graph, after
    `dist.init_process_group`. Runs the graph `warmup` times untimed (first-use connection
    setup, allocator and BLAS warm-up), then once timed. A communication task that does not
    complete within `timeout_s` raises ExecError naming the rank, task, kind and peers.
    """
    return run_rank_timed(graph, rank, backend, device, timeout_s, warmup, 1, clock_rounds)[0]


def run_rank_timed(
    graph: TaskGraph,
    rank: int,
    backend: str = "gloo",
    device: torch.device | str | None = None,
    timeout_s: float = 60.0,
    warmup: int = 1,
    runs: int = 1,
    clock_rounds: int = 8,
) -> list[RankResult]:
    """As `run_rank`, with `runs` timed runs after the warm-up, each on clocks aligned again
    and from an origin of its own: one result per timed run."""
    if not dist.is_initialized():
        raise ExecError("run_rank needs torch.distributed initialised (see exec.runtime.launch)")
    world = dist.get_world_size()
    if world != graph.world_size:
        raise ExecError(
            f"the graph is for {graph.world_size} ranks but {world} processes were started"
        )
    if dist.get_rank() != rank:
        raise ExecError(f"run_rank(rank={rank}) called on process of rank {dist.get_rank()}")
    dev = torch.device(device) if device is not None else default_device(backend)
    mine = [t for t in graph if t.rank == rank]
    for t in mine:
        for d in t.deps:
            if d not in graph.tasks:
                raise ExecError(f"task {t.id!r} depends on unknown task {d!r}")
            if graph.tasks[d].rank != rank:
                raise ExecError(
                    f"task {t.id!r} on rank {rank} depends on {d!r} of rank "
                    f"{graph.tasks[d].rank}: dependencies across ranks go through communication"
                )

    # Communicators first: new_group is collective over the whole world, in one order.
    plan = plan_channels(graph)
    groups = create_groups(plan, timeout_s, backend)
    control = _control_group(backend)
    factory = OpFactory(graph, rank, dev, plan, groups)
    ops = [factory.build(t) for t in mine]

    if dev.type == "cuda":
        runner: HostStreams | _CudaExecutor = _CudaExecutor(graph, rank, ops, dev, timeout_s)
    else:
        runner = HostStreams(rank, ops, timeout_s)

    # A rank that finishes first waits at the barrier for the others' trailing work, which
    # is bounded by the run itself; a failed peer is reported by that peer (and the launcher
    # stops everyone), so these waits are generous and never the first error.
    def after_run(elapsed_s: float) -> float:
        return max(SETUP_TIMEOUT_S, 2 * elapsed_s + timeout_s)

    for _ in range(warmup):
        began = time.monotonic()
        runner.run()
        _barrier(control, after_run(time.monotonic() - began), rank, "after a warm-up run")

    results = []
    for _ in range(max(runs, 1)):
        clocks = sync_clocks(clock_rounds, group=control)
        clock = clocks[rank]
        _barrier(control, SETUP_TIMEOUT_S, rank, "before the timed run")
        mark = clock.to_reference(time.perf_counter_ns())
        origin = torch.tensor([mark], dtype=torch.int64)
        dist.all_reduce(origin, op=dist.ReduceOp.MIN, group=control)
        began = time.monotonic()
        stamps = runner.run()
        _barrier(control, after_run(time.monotonic() - began), rank, "after the timed run")
        rows = _rows(ops, stamps, clock, int(origin.item()))
        extra: dict[str, Any] = {"clocks": [(c.offset_ns, c.bound_ns) for c in clocks]}
        if isinstance(runner, _CudaExecutor):  # one host thread issues every task (not on CPU)
            extra["issue_s"] = dict(runner.issue_s)
        results.append(RankResult(rank, rows, clock, str(dev), extra))
    return results


def _rows(
    ops: list[Op], stamps: dict[str, tuple[int, int]], clock: ClockSync, t0: int
) -> list[dict[str, Any]]:
    """One timed run's trace rows: host stamps on the reference clock, from the origin t0."""
    rows = []
    for op in ops:
        t = op.task
        start_ns, end_ns = stamps[t.id]
        start = (clock.to_reference(start_ns) - t0) / 1e9
        end = (clock.to_reference(end_ns) - t0) / 1e9
        row = {
            "id": t.id,
            "rank": t.rank,
            "stream": t.stream,
            "kind": t.kind,
            "start": start,
            "end": end,
            "duration": end - start,
            "sync_wait": 0.0,  # filled in from all ranks' starts by exec.runtime.launch.assemble
            "bytes": float(t.bytes),
            "flops": float(t.flops),
        }
        for tag in TAGS:
            row[tag] = t.tags.get(tag)
        rows.append({c: row[c] for c in COLUMNS})
    return rows


def _control_group(backend: str):
    """Host-side control traffic (barriers, clock ping-pong): gloo, never a comm channel.

    Its own timeout is CONTROL_TIMEOUT_S (see exec.runtime.launch); waits on it carry their own."""
    if backend == "gloo":
        return None  # the default group; channels never use it
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=CONTROL_TIMEOUT_S))


def _barrier(group, timeout_s: float, rank: int, when: str) -> None:
    work = dist.barrier(group=group, async_op=True)
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise ExecError(f"rank {rank}: barrier {when} failed: {one_line(e)}") from None
    if ok is False:
        raise ExecError(f"rank {rank}: barrier {when} timed out after {timeout_s:g} s")


def global_issue_order(graph: TaskGraph) -> list[str]:
    """A topological order of all tasks (deps, stream order, collective rendezvous) that
    every rank computes identically: ties broken by position in the graph."""
    index = {tid: i for i, tid in enumerate(graph.tasks)}
    node_of = {
        t.id: f"coll:{t.coll}" if t.kind in COMM_KINDS else t.id for t in graph.tasks.values()
    }
    members: dict[str, list[str]] = defaultdict(list)
    for tid, n in node_of.items():
        members[n].append(tid)
    succ: dict[str, set[str]] = defaultdict(set)
    indeg = dict.fromkeys(members, 0)

    def edge(a: str, b: str) -> None:
        if a != b and b not in succ[a]:
            succ[a].add(b)
            indeg[b] += 1

    for t in graph.tasks.values():
        for d in t.deps:
            edge(node_of[d], node_of[t.id])
    for seq in graph.streams().values():
        for a, b in zip(seq, seq[1:]):
            edge(node_of[a.id], node_of[b.id])
    key = {n: min(index[m] for m in ms) for n, ms in members.items()}
    ready = [(key[n], n) for n, k in indeg.items() if k == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.extend(sorted(members[n], key=index.__getitem__))
        for m in succ.get(n, ()):
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(ready, (key[m], m))
    if len(order) != len(graph.tasks):
        raise ExecError("the graph has a cycle; validate it (TaskGraph.validate) first")
    return order


class _CudaExecutor:
    def __init__(
        self, graph: TaskGraph, rank: int, ops: list[Op], device: torch.device, timeout_s: float
    ):
        self.rank, self.device, self.timeout_s = rank, device, timeout_s
        by_id = {op.task.id: op for op in ops}
        self.ops = [by_id[tid] for tid in global_issue_order(graph) if tid in by_id]
        self.ops_stream = {op.task.id: op.task.stream for op in ops}
        self.streams = {
            s: torch.cuda.Stream(device=device) for s in dict.fromkeys(op.task.stream for op in ops)
        }

    def _wait_for(self, op: Op, events: dict[str, tuple[Any, Any]]) -> None:
        """Block the host until `op` has finished on its stream; a timeout means no progress
        for timeout_s, reported as the first unfinished communication issued so far."""
        deadline = time.monotonic() + self.timeout_s
        end = events[op.task.id][1]
        while not end.query():
            if time.monotonic() > deadline:
                # compute behind a stuck communication is only waiting for it
                stuck = [
                    o for o in self.ops if o.task.id in events and not events[o.task.id][1].query()
                ]
                culprit = next((o for o in stuck if o.is_comm), stuck[0] if stuck else op)
                raise comm_failure(self.rank, culprit, self.timeout_s, None)
            time.sleep(0.0005)

    def run(self) -> dict[str, tuple[int, int]]:
        torch.cuda.synchronize(self.device)
        ref = torch.cuda.Event(enable_timing=True)
        ref.record(torch.cuda.current_stream(self.device))
        ref.synchronize()
        host_ref = time.perf_counter_ns()  # host clock at `ref`, within a few microseconds
        events: dict[str, tuple[Any, Any]] = {}
        # host seconds spent issuing each task (its waits, events and launch), not its host
        # sync: what the simulator's launch thread costs per task (sim.hardware.costs.launch)
        self.issue_s: dict[str, float] = {}
        for op in self.ops:
            began = time.perf_counter_ns()
            t = op.task
            stream = self.streams[t.stream]
            for d in t.deps:  # same rank, earlier in the issue order: already recorded
                if self.ops_stream[d] != t.stream:
                    stream.wait_event(events[d][1])
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record(stream)
                work = op.launch()
                if op.is_comm and work is not None:
                    work.wait()  # the stream waits for the communicator's stream; host goes on
                end.record(stream)
            events[t.id] = (start, end)
            self.issue_s[t.id] = (time.perf_counter_ns() - began) * 1e-9
            if t.host_sync:  # the host reads its result (split sizes): nothing issues before
                self._wait_for(op, events)
        for op in self.ops:
            self._wait_for(op, events)
        return {
            tid: (
                host_ref + int(ref.elapsed_time(s) * 1e6),
                host_ref + int(ref.elapsed_time(e) * 1e6),
            )
            for tid, (s, e) in events.items()
        }
