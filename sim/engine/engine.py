"""The discrete-event engine: replays a TaskGraph on a Topology with a CostModel (SimPy).

It knows nothing about MoE. Per rank, each stream runs its tasks in program order; a task
launches when its stream reaches it and its dependencies are done. A collective starts when
every member has launched it (NCCL semantics: a launched member occupies its stream while it
waits, recorded as `sync_wait`). In flow mode a collective becomes phases of flows whose rates
are max-min fair shares, recomputed whenever flows start or end; in collective mode it takes
alpha + beta * bytes (both in `sim.engine.comm`). A task's speed is scaled by the
interference table according to which other stream kinds are busy on its GPU, and by the SMs
and HBM bandwidth that kernels reserving SMs (`Task.sms`) hold beside it
(`sim.engine.resources`, `sim.hardware.costs.resources`); a rank with more streams than
hardware queues launches in host issue order per queue (`sim.engine.queues`), and a task
starts no earlier than its rank's host launch thread issues it (`sim.engine.launch`: a
launch cost per task, and host syncs that stop the thread until they finish). Tasks left
when no event remains are a deadlock, reported as its cycle of waits (`sim.engine.deadlock`).

The engine is callback-driven on SimPy's event queue (no generator per task), which keeps a
2,048-GPU layer in seconds. Given a `Symmetry`, the graph holds only representative ranks'
tasks and the network carries the copies they stand for (`sim.engine.symmetric` builds both).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.core.errors import DeadlockError, GraphError
from sim.core.graph import Task, TaskGraph
from sim.core.kinds import COLLECTIVE_KINDS, P2P_KINDS
from sim.engine.comm import Comm
from sim.engine.launch import LaunchThread
from sim.engine.queues import HardwareQueues
from sim.engine.resources import SmState
from sim.engine.result import SimResult
from sim.engine.symmetry import Symmetry
from sim.engine.watch import Watch
from sim.hardware.costs import CostModel
from sim.hardware.network import FlowNetwork
from sim.hardware.topology import Topology

if TYPE_CHECKING:
    from typing import TypeVarTuple, Unpack

    Ts = TypeVarTuple("Ts")

__all__ = ["Engine", "SimResult", "simulate"]


class _Activity:
    """Local work (compute or collective-level comm) progressing at an interference-scaled rate."""

    __slots__ = ("task", "rank", "kind", "remaining", "rate", "last", "version")

    def __init__(self, task: int, rank: int, kind: str, work: float, now: float):
        self.task, self.rank, self.kind = task, rank, kind
        self.remaining, self.rate, self.last, self.version = work, 1.0, now, 0


class Engine(Comm):
    def __init__(
        self,
        graph: TaskGraph,
        topo: Topology,
        costs: CostModel,
        symmetry: Symmetry | None = None,
        record_links: bool = False,
    ):
        if graph.world_size > topo.world_size:
            raise GraphError(
                f"graph has {graph.world_size} ranks but topology {topo.name} with "
                f"{topo.nodes} node(s) has only {topo.world_size} GPUs"
            )
        self.graph, self.topo, self.costs = graph, topo, costs
        self.sym = symmetry
        self.dispatch = costs.dispatch
        self.jitter = costs.jitter.sampler() if costs.jitter else None
        self.env = simpy.Environment()
        self.tasks = list(graph)
        n = len(self.tasks)
        self.index = index = {t.id: i for i, t in enumerate(self.tasks)}
        self.deps_left = [len(t.deps) for t in self.tasks]
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        for i, t in enumerate(self.tasks):
            for d in t.deps:
                self.dependents[index[d]].append(i)
        streams: dict[tuple[int, str], list[int]] = defaultdict(list)
        for i, t in enumerate(self.tasks):
            streams[(t.rank, t.stream)].append(i)
        self.stream_keys = list(streams)
        self.stream_tasks = [streams[k] for k in self.stream_keys]
        self.stream_of = [0] * n
        for s, seq in enumerate(self.stream_tasks):
            for i in seq:
                self.stream_of[i] = s
        self.head = [0] * len(self.stream_tasks)
        self.running = [False] * len(self.stream_tasks)
        self.start = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.sync_wait = np.zeros(n)
        self.done = 0
        # collectives / p2p: id -> member task indices, and launch counters
        self.coll_members: dict[str, list[int]] = defaultdict(list)
        for i, t in enumerate(self.tasks):
            if t.kind in COLLECTIVE_KINDS or t.kind in P2P_KINDS:
                # a comm task's coll is set (sim.core.graph_checks refuses one without)
                self.coll_members[t.coll].append(i)  # type: ignore[index]
        self.coll_arrived: dict[str, int] = defaultdict(int)
        # interference: busy stream kinds per rank
        inter = costs.interference
        # SMs reserved by tasks (sim.engine.resources): rates then change as kernels come and go
        self.sm = SmState(self.tasks, costs.resources, str(topo.gpu.get("model", topo.name)))
        self.interfere = not inter.trivial or self.sm.active
        self.queues = HardwareQueues.build(
            self.tasks,
            self.stream_of,
            self.stream_keys,
            costs.resources.max_connections,
            getattr(costs.compute, "waves", None),
        )
        # the host thread issuing each rank's tasks (None: launches are free, nothing syncs)
        self.launch = LaunchThread.build(
            self.tasks,
            costs.launch,
            lambda: self.env.now,
            self._after,
            lambda i: self._try_launch(self.stream_of[i]),
        )
        self.busy: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.acts: dict[int, set[_Activity]] = defaultdict(set)
        # memory
        self.mem = np.zeros(graph.world_size)
        self.mem_peak = np.zeros(graph.world_size)
        self.buffers: dict[tuple[int, str], float] = {}
        self.mem_timeline: list[tuple[float, int, float]] = []
        # network
        self.flow_mode = costs.network == "flow"
        self.net = FlowNetwork(
            topo,
            lambda: self.env.now,
            self._flow_scale if inter.affects("comm") or inter.affects("copy") else None,
            costs.finish_rtol,
        )
        if record_links:  # for a trace's counter tracks; a pass over the links per solve
            self.net.record(None if symmetry is None else symmetry.orbit)
        self.owners = []  # running collectives by owner id (Comm.owners)
        self._ending: set[int] = set()  # comm tasks waiting out their SMs' send time (comm)
        self._net_version = 0
        self._net_dirty = False
        self.fidelity_used = {"flow": 0, "bundled": 0, "collective": 0}
        self.watch = Watch(n, costs.finish_rtol)  # progress bar and slow-solve hint

    # -- driving ---------------------------------------------------------------------------
    def run(self) -> SimResult:
        try:
            if self.launch is not None:
                self.launch.start()
            for s in range(len(self.stream_tasks)):
                self._try_launch(s)
            self.env.run()
        finally:
            self.watch.close()
        if self.done < len(self.tasks):
            raise DeadlockError(self._deadlock_report())
        return SimResult(
            self.graph,
            self.topo,
            self.costs,
            self.start,
            self.end,
            self.sync_wait,
            self.net.carried,
            self.mem_peak,
            self.mem_timeline,
            stats={
                "tasks": len(self.tasks),
                "fidelity": {k: v for k, v in self.fidelity_used.items() if v},
                "bundles": self.net.bundles_started,
                "flows": self.net.flows_started,
                "rate_recomputes": self.net.recomputes,
            },
            link_timeline=None if self.net.timeline is None else self.net.timeline.as_dict(),
        )

    def _try_launch(self, s: int, after: float = 0.0) -> None:
        """Launch the head task of stream `s` if it is ready, `after` seconds from now: the
        dispatch latency of whatever made it ready (the stream's previous task, or a task on
        another stream it depended on; see CostModel.dispatch)."""
        if self.running[s]:
            return
        seq = self.stream_tasks[s]
        h = self.head[s]
        if h >= len(seq):
            return
        i = seq[h]
        if self.deps_left[i] == 0:
            if self.launch is not None and not self.launch.issued[i]:
                return  # the host has not launched it yet: tried again on issue
            q = self.queues
            if q is not None and not q.ready(i):
                return  # behind an earlier task on its hardware queue: tried again on issue
            self.running[s] = True  # the stream is taken while the launch is under way
            if q is not None and not q.holds(i):
                nxt = q.issue(i)
                if nxt is not None:
                    self._try_launch(nxt, after)
            if after > 0:
                self._after(after, self._launch, i)
            else:
                self._launch(i)

    def _launch(self, i: int) -> None:
        t = self.tasks[i]
        now = self.env.now
        self.start[i] = now
        for name, nbytes in t.allocs.items():
            key = (t.rank, name)
            if key in self.buffers:
                raise GraphError(f"task {t.id!r}: allocates buffer {name!r} that is still live")
            self.buffers[key] = nbytes
            self._mem_change(t.rank, nbytes)
        self._set_busy(t.rank, t.stream_kind, +1)
        if t.kind in COLLECTIVE_KINDS or t.kind in P2P_KINDS:
            self._arrive(i)
        elif t.kind in ("d2h", "h2d") and self.costs.measured(t) is None:
            self._copy(i)
        else:  # compute kinds and d2d run locally
            dur = self.costs.compute.duration(t)
            if self.jitter is not None:
                dur *= self.jitter.factor(t.kind, "compute")
            if t.sms > 0:  # a compute or copy kernel's SMs are its own (Task.sms)
                dur = self.costs.resources.stream_duration(t.sms, t.bytes, dur)
                self._reserve(i, t, self.costs.resources.mem_share(t.bytes, dur))
            self._local(i, t.stream_kind, dur)
            return
        if self.sm.sms[i] > 0:  # a communication kernel holds its SMs from launch, waiting included
            # and the HBM share its task states (`hbm_share`; none: its SMs only)
            self._reserve(i, t, min(1.0, max(0.0, float(t.tags.get("hbm_share", 0.0)))))

    def _finish(self, i: int) -> None:
        t = self.tasks[i]
        self.end[i] = self.env.now
        self.done += 1
        if self.done >= self.watch.next:
            self.watch.tick(self.done, self.env.now)
        for name in t.frees:
            nbytes = self.buffers.pop((t.rank, name), None)
            if nbytes is None:
                raise GraphError(f"task {t.id!r}: frees buffer {name!r} that is not live")
            self._mem_change(t.rank, -nbytes)
        self._set_busy(t.rank, t.stream_kind, -1)
        if self.sm.sms[i] > 0:
            self.sm.release(i, t)
            self._rerate_rank(t.rank)
        s = self.stream_of[i]
        self.running[s] = False
        self.head[s] += 1
        if self.queues is not None and self.queues.holds(i):  # its last blocks are out
            nxt = self.queues.issue(i)
            if nxt is not None and nxt != s:  # its own stream is tried below, as always
                self._try_launch(nxt, self.dispatch.cross)
        for j in self.dependents[i]:
            self.deps_left[j] -= 1
            if self.deps_left[j] == 0:
                js = self.stream_of[j]
                self._try_launch(js, self.dispatch.stream if js == s else self.dispatch.cross)
        self._try_launch(s, self.dispatch.stream)
        if self.launch is not None and t.host_sync:  # the host was waiting for this one
            self.launch.finished(i, t.rank, self.env.now)

    def _after(self, delay: float, fn: Callable[[Unpack[Ts]], None], *args: Unpack[Ts]) -> None:
        ev = self.env.timeout(max(delay, 0.0))
        ev.callbacks.append(lambda _e: fn(*args))

    # -- memory ----------------------------------------------------------------------------
    def _mem_change(self, rank: int, delta: float) -> None:
        self.mem[rank] += delta
        self.mem_peak[rank] = max(self.mem_peak[rank], self.mem[rank])
        self.mem_timeline.append((self.env.now, rank, float(self.mem[rank])))

    # -- local work and interference ---------------------------------------------------------
    def _local(self, i: int, kind: str, duration: float) -> None:
        if duration < 0 or not math.isfinite(duration):
            raise GraphError(f"task {self.tasks[i].id!r}: cost model gave duration {duration}")
        if not self.interfere:
            self._after(duration, self._finish, i)
            return
        act = _Activity(i, self.tasks[i].rank, kind, duration, self.env.now)
        self.acts[act.rank].add(act)
        self._rerate(act)

    def _rerate(self, act: _Activity) -> None:
        now = self.env.now
        act.remaining -= act.rate * (now - act.last)
        act.last = now
        busy = self.busy[act.rank]
        others = frozenset(k for k, c in busy.items() if c > 0 and k != act.kind)
        act.rate = self.costs.interference.speed(act.kind, others)
        if self.sm.active:
            act.rate *= self.sm.speed(self.tasks[act.task])
        act.version += 1
        v = act.version
        self._after(max(act.remaining, 0.0) / act.rate, self._act_done, act, v)

    def _act_done(self, act: _Activity, version: int) -> None:
        if version != act.version:
            return
        self.acts[act.rank].discard(act)
        self._finish(act.task)

    def _reserve(self, i: int, t: Task, share: float) -> None:
        self.sm.hold(i, t, share)
        self._rerate_rank(t.rank)

    def _rerate_rank(self, rank: int) -> None:
        for act in list(self.acts[rank]):
            self._rerate(act)

    def _set_busy(self, rank: int, kind: str, delta: int) -> None:
        # A stream is busy from launch: a communication kernel waiting for its peers already
        # holds its SMs (NCCL kernels spin), so it interferes while it waits.
        if not self.interfere:
            return
        b = self.busy[rank]
        before = b[kind] > 0
        b[kind] += delta
        if (b[kind] > 0) != before:
            for act in list(self.acts[rank]):
                self._rerate(act)
            if self.net.rate_scale is not None and self.net.active:
                self._net_touch()

    # -- diagnostics -------------------------------------------------------------------------
    def _deadlock_report(self) -> str:
        from sim.engine.deadlock import report  # only when a run has failed

        return report(self)


def simulate(
    graph: TaskGraph, topo: Topology, costs: CostModel, record_links: bool = False
) -> SimResult:
    """One run; with a jitter model, `costs.jitter.replicas` runs (seeds seed, seed+1, ...)
    and the one with the median makespan, every replica's makespan in its stats.
    `record_links`: keep the utilisation of each link class over time (for a trace)."""
    jit = costs.jitter
    if jit is None or jit.replicas == 1:
        return Engine(graph, topo, costs, record_links=record_links).run()
    runs = [
        Engine(
            graph,
            topo,
            replace(costs, jitter=jit.with_seed(jit.seed + k)),
            record_links=record_links,
        ).run()
        for k in range(jit.replicas)
    ]
    spans = [r.makespan for r in runs]
    median = runs[int(np.argsort(spans)[len(spans) // 2])]
    median.stats["replica_makespans"] = spans
    return median
