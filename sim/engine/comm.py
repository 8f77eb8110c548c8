"""The engine's communication: collective rendezvous, phases of flows, copies over PCIe, and
the network event loop (rates recomputed once per instant at which flows start or end).

A mixin of `sim.engine.engine.Engine`: it reads the engine's tasks, clock and bookkeeping
and calls back `_finish`, `_local` and `_after`. With a `Symmetry` (sim.engine.symmetry),
only representative ranks have tasks: a collective starts when its present members have
launched (the ranks they stand for launch at the same instants), its flows are those of the
whole membership, and each batch is folded onto the links the simulation keeps, counting
the copies of the collective that the replicas and represented ranks run at the same time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.arrays import distinct
from sim.core.graph import Task
from sim.core.kinds import COLLECTIVE_KINDS, P2P_KINDS
from sim.engine.watch import clock
from sim.hardware import collectives as coll_algos
from sim.hardware.costs.measured import measured
from sim.hardware.network import (
    BundleBatch,
    bundled_uniform,
    pair_mask,
    per_flow,
    product_layout,
)

if TYPE_CHECKING:  # the engine state's types (annotations only)
    from collections.abc import Callable
    from typing import TypeVarTuple, Unpack

    import simpy

    from sim.core.graph import TaskGraph
    from sim.engine.symmetry import Symmetry
    from sim.engine.watch import Watch
    from sim.hardware.costs import CostModel
    from sim.hardware.costs.jitter import JitterSampler
    from sim.hardware.network import FlowNetwork
    from sim.hardware.topology import Topology

    Ts = TypeVarTuple("Ts")


class _CollRun:
    """A running collective (or send/recv pair): its phases and who is still waiting."""

    __slots__ = (
        "members",
        "rank_task",
        "phases",
        "k",
        "pending",
        "bundles_left",
        "kind",
        "size",
        "copies",
        "t0",
        "wire",
    )

    def __init__(
        self,
        members: list[int],
        rank_task: dict[int, int],
        phases: list[coll_algos.Phase],
        kind: str,
        size: int,
        copies: float = 1.0,
    ):
        self.members, self.rank_task, self.phases, self.kind = members, rank_task, phases, kind
        self.size = size  # ranks taking part (more than `members` under symmetry)
        self.copies = copies  # instances running at once in the represented cluster
        self.k = 0
        self.pending: np.ndarray | None = None
        self.bundles_left = 0
        self.t0 = 0.0  # when every member had arrived
        self.wire = 1.0  # link bytes per payload byte (`comm_sm_efficiency`)


class Comm:
    """Communication for `Engine` (see the module docstring).

    The annotations below are the engine state this mixin reads and writes: `Engine.__init__`
    sets every one of them (they are declarations only, no class attributes), and mypy checks
    that the engine's values agree with them. The three methods under TYPE_CHECKING are the
    engine's, which the mixin calls back.
    """

    graph: TaskGraph
    topo: Topology
    costs: CostModel
    sym: Symmetry | None
    jitter: JitterSampler | None
    env: simpy.Environment
    tasks: list[Task]
    start: np.ndarray
    end: np.ndarray
    sync_wait: np.ndarray
    done: int
    coll_members: dict[str, list[int]]
    coll_arrived: dict[str, int]
    busy: dict[int, dict[str, int]]
    flow_mode: bool
    net: FlowNetwork
    owners: list[_CollRun | None]  # by owner id; None once the run's last bundle is done
    _ending: set[int]
    _net_version: int
    _net_dirty: bool
    fidelity_used: dict[str, int]
    watch: Watch

    if TYPE_CHECKING:

        def _finish(self, i: int) -> None: ...

        def _local(self, i: int, kind: str, duration: float) -> None: ...

        def _after(
            self, delay: float, fn: Callable[[Unpack[Ts]], None], *args: Unpack[Ts]
        ) -> None: ...

    def _flow_scale(self, m: BundleBatch, owners: np.ndarray) -> np.ndarray:
        # A bundle's speed follows the interference on its first source rank (bundles are
        # symmetric, so any member stands for all); copies are `copy` work, the rest `comm`.
        first = np.full(len(m.count), -1, dtype=np.int64)
        first[m.rank_b[::-1]] = m.rank_r[::-1]
        if self.sym is not None:  # a represented rank is as busy as its representative
            first = self.sym.rep_of[first]
        out = np.ones(len(m.count))
        for o in np.unique(owners):
            kind = "copy" if self.owners[o].kind in ("d2h", "h2d") else "comm"
            of_owner = owners == o
            for r in np.unique(first[of_owner]):
                busy = self.busy[int(r)]
                others = frozenset(k for k, c in busy.items() if c > 0 and k != kind)
                out[of_owner & (first == r)] = self.costs.interference.speed(kind, others)
        return out

    # -- collectives -----------------------------------------------------------------------
    def _arrive(self, i: int) -> None:
        t = self.tasks[i]
        # keyed by coll as given, as Engine.__init__ grouped them (set on every comm task of
        # a checked graph: sim.core.graph_checks; the engine does not check it again)
        cid = t.coll
        self.coll_arrived[cid] += 1  # type: ignore[index]
        members = self.coll_members[cid]  # type: ignore[index]
        if self.coll_arrived[cid] < len(members):  # type: ignore[index]
            return
        now = self.env.now
        for m in members:
            self.sync_wait[m] = now - self.start[m]
        tasks = [self.tasks[m] for m in members]
        rank_task = {self.tasks[m].rank: m for m in members}
        if t.kind in P2P_KINDS:
            snd = next(x for x in tasks if x.kind == "send")
            phases: list[coll_algos.Phase] = [
                coll_algos.ExplicitPhase(
                    np.array([snd.rank]), np.array([snd.peer]), np.array([snd.bytes])
                )
            ]
            kind, size = "send", 2
        else:
            phases = coll_algos.phases(tasks, self.topo) if self.flow_mode else []
            # a collective's group is set (sim.core.graph_checks refuses one without)
            kind, size = t.kind, len(t.group)  # type: ignore[arg-type]
        copies = 1.0 if self.sym is None else self.sym.copies(list(rank_task), size)
        run = _CollRun(members, rank_task, phases, kind, size, copies)
        run.t0 = now
        # an SM-holding kernel (DeepEP's) reaches comm_sm_efficiency of its links' rate
        run.wire = self.costs.resources.wire_factor(max(x.sms for x in tasks))
        if not self.flow_mode:
            self.fidelity_used["collective"] += 1
            n = size if t.kind in COLLECTIVE_KINDS else 2
            # one draw per collective: it is one operation, as slow as it is for everyone
            noise = self.jitter.factor(kind, "comm") if self.jitter is not None else 1.0
            for m in members:
                dur = self.costs.comm_duration(self.tasks[m], kind, n) * noise
                if measured(self.tasks[m]) is None:
                    dur *= run.wire
                self._local(m, "comm", max(dur, self._sm_floor(m)))
            return
        self._start_phase(run)

    def _sm_floor(self, m: int) -> float:
        """Seconds member m's kernel needs at least on the SMs it reserves (`comm_sm_bw`;
        only a task's own `sms`, DeepEP's kernels: NCCL's `comm_sms` take SMs from the
        compute beside them, but their send rate per SM is not known here). The same SMs
        send and receive (DeepEP splits its channels' warps between the two), and the rate
        per SM was measured on balanced traffic: the larger direction is bounded, so a GPU
        receiving more than it sends (a hot expert GPU) is slowed by its own kernel."""
        t = self.tasks[m]
        nbytes = max(t.bytes, float(sum(t.recv_split))) if t.recv_split else t.bytes
        return self.costs.resources.comm_floor(t.sms, nbytes)

    def _done(self, run: _CollRun, m: int) -> None:
        """Member m's part of the collective is over: it ends now, or once the SMs its
        kernel holds could have sent its bytes, whichever is later."""
        if not math.isnan(self.end[m]) or m in self._ending:
            return
        wait = run.t0 + self._sm_floor(m) - self.env.now
        if wait > 0:
            self._ending.add(m)
            self._after(wait, self._finish, m)
        else:
            self._finish(m)

    def _start_phase(self, run: _CollRun) -> None:
        if run.k >= len(run.phases):
            for m in run.members:
                self._done(run, m)
            return
        phase = run.phases[run.k]
        if isinstance(phase, coll_algos.LocalPhase):
            # Every member copies the same bytes; the phase ends when they all have.
            t0 = self.tasks[run.members[0]]
            copy = Task(
                f"{t0.id}#copy",
                t0.rank,
                "copy",
                "d2d",
                bytes=2.0 * phase.nbytes,
                tags={"dtype": t0.tags.get("dtype", "bf16")},
            )
            self._after(self.costs.compute.duration(copy), self._next_phase, run)
            return
        batch = self._bundle(phase, run.size)
        if run.wire != 1.0:
            batch.nbytes = batch.nbytes * run.wire
        run.pending = np.bincount(batch.rank_r, minlength=self.graph.world_size)
        run.bundles_left = len(batch)
        if run.bundles_left == 0:
            self._next_phase(run)
            return
        if run.k == len(run.phases) - 1:
            # Members no flow touches are done as soon as the last phase starts.
            for r, m in run.rank_task.items():
                if run.pending[r] == 0:
                    self._done(run, m)
        self._send(batch, run)

    def _send(self, batch: BundleBatch, run: _CollRun) -> None:
        """Put a batch on the network, each group of equal latency once that has passed."""
        if self.sym is not None:
            batch = self.sym.fold(batch, run.copies)
        owner = len(self.owners)
        self.owners.append(run)
        for lat in distinct(batch.latency):
            sub = batch.select(batch.latency == lat)
            self._after(float(lat), self._net_add, sub, owner)

    def _next_phase(self, run: _CollRun) -> None:
        run.k += 1
        self._start_phase(run)

    def _bundle(self, phase: Any, group_size: int) -> BundleBatch:
        """Flows of one phase, bundled where that is exact and asked for (counted per phase)."""
        alpha = self.costs.alpha
        if isinstance(phase, coll_algos.UniformPhase):
            fid = self.costs.fidelity
            want = fid == "bundled" or (fid == "auto" and group_size >= self.costs.bundle_min_ranks)
            layout = product_layout(self.topo, phase.members) if want else None
            if layout is not None:
                batch = bundled_uniform(
                    self.topo, layout[0], layout[1], phase.per_pair, alpha, phase.pairs, phase.relay
                )
                if batch is not None:
                    self.fidelity_used["bundled"] += 1
                    return batch
            mem = phase.members
            src = np.repeat(mem, len(mem))
            dst = np.tile(mem, len(mem))
            keep = pair_mask(self.topo, src, dst, phase.pairs)
            self.fidelity_used["flow"] += 1
            return per_flow(
                self.topo,
                src[keep],
                dst[keep],
                np.full(int(keep.sum()), phase.per_pair),
                alpha,
                phase.relay,
            )
        self.fidelity_used["flow"] += 1
        return per_flow(self.topo, phase.src, phase.dst, phase.nbytes, alpha, phase.relay)

    def _copy(self, i: int) -> None:
        t = self.tasks[i]
        fitted = getattr(self.costs.compute, "params", {}).get(t.kind)
        if not self.flow_mode and fitted is not None:  # a calibrated copy engine
            self._local(i, "copy", fitted[0] + fitted[1] * t.bytes)
            return
        route = self.topo.host_route(t.rank, to_host=t.kind == "d2h")
        if not self.flow_mode:
            bw = float(self.topo.link_cap[route].min())
            self._local(i, "copy", self.costs.alpha + t.bytes / bw)
            return
        if t.bytes <= 0:
            self._finish(i)
            return
        links = np.asarray(route, dtype=np.int64)
        batch = BundleBatch(
            np.ones(1),
            np.array([float(t.bytes)]),
            np.array([self.costs.alpha + self.topo.route_latency(route)]),
            np.zeros(len(links), dtype=np.int64),
            links,
            np.ones(len(links)),
            np.zeros(1, dtype=np.int64),
            np.array([t.rank]),
        )
        copies = 1.0 if self.sym is None else self.sym.copies([t.rank], 1)
        run = _CollRun([i], {t.rank: i}, [], t.kind, 1, copies)
        run.pending = np.bincount(batch.rank_r, minlength=self.graph.world_size)
        run.bundles_left = 1
        self._send(batch, run)

    # -- network event loop ------------------------------------------------------------------
    def _net_add(self, batch: BundleBatch, owner: int) -> None:
        self.net.add(batch, owner)
        self._net_touch()

    def _net_touch(self) -> None:
        """Recompute rates once per instant, after every change made at this instant."""
        if self._net_dirty:
            return
        self._net_dirty = True
        ev = self.env.event()
        ev.callbacks.append(self._net_resolve)
        ev.succeed()

    def _net_resolve(self, _ev: Any = None) -> None:
        self._net_dirty = False
        t0 = clock()
        self.net.recompute()
        self.watch.solved(clock() - t0, self.done, self.env.now)
        self._net_version += 1
        t = self.net.next_finish()
        if math.isfinite(t):
            v = self._net_version
            self._after(t - self.env.now, self._net_fire, v)

    def _net_fire(self, version: int) -> None:
        if version != self._net_version:
            return
        finished = self.net.pop_finished()
        for owner, n_bundles, ranks in finished:
            run = self.owners[owner]
            assert run is not None  # an owner is cleared only once its last bundle is done
            run.bundles_left -= n_bundles
            assert run.pending is not None
            np.subtract.at(run.pending, ranks, 1)
            last = run.k == len(run.phases) - 1 or not run.phases
            if last:
                for r in distinct(ranks):
                    if run.pending[r] == 0 and int(r) in run.rank_task:
                        self._done(run, run.rank_task[int(r)])
            if run.bundles_left == 0:
                self.owners[owner] = None
                if run.phases:
                    self._next_phase(run)
                else:
                    for m in run.members:
                        self._done(run, m)
        self._net_touch()
