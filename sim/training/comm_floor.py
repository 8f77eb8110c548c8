"""A lower bound on a collective's simulated time that runs no simulation, for `moesim
plan`'s pruning (`sim.training.plan_work`): `FloorTimer` answers what `CommTimer`
(`sim.training.comm`) asks the engine, from the same tasks, phases and flows, but without
the event loop and the max-min solver.

The engine runs a collective as phases, each starting once the one before has ended on
every member (`sim.hardware.collectives`); a phase's flows start after their latency
(alpha plus the route's links) and share each link at most at its rate (`link_cap`, the
efficiency applied), each message carrying its per-message and per-connection cost as
bytes (`sim.hardware.network.layouts`), scaled by the wire factor of an SM-holding kernel.
So a phase lasts at least, on every link it uses, the earliest start of a flow on that link
plus the bytes crossing it over its rate, and at least each flow's latency plus its bytes
over its slowest link; a collective at least the sum of its phases, and a member whose
kernel holds SMs at least their floor (`Resources.comm_floor`). Each group's collective is
bounded alone (a group is never faster for sharing links with the others), for the first
and the last group of the dimension (their shapes on the topology stand for the others'
in the regular placements a layout makes); point-to-point sends, one flow per member, are
bounded all together, as one phase of every group's flows. Bytes are rounded as
`CommTimer` rounds them, so the floor bounds the very collective `CommTimer` simulates.
"""

from __future__ import annotations

import numpy as np

from sim.core.graph import Task
from sim.core.kinds import P2P_KINDS
from sim.hardware import collectives as coll_algos
from sim.hardware.costs import CostModel
from sim.hardware.network import bundled_uniform, pair_mask, per_flow, product_layout
from sim.hardware.network.bundles import BundleBatch
from sim.hardware.network.flows import FINISH_RTOL
from sim.hardware.topology import Topology
from sim.training.comm import BYTES_QUANTUM, CommTimer

# the engine ends flows within FINISH_RTOL of each other together, so a flow may end that
# much early: the floor gives way by more than that
SLACK = 1.0 - 1e3 * FINISH_RTOL
FLOORS_MAX = 1 << 16  # floors kept per process before the cache starts over
# (id of the topology, id of its cost model) -> (topology, cost model, {key: seconds}):
# the objects are held so that their ids stay theirs while the entries exist
_FLOORS: dict[tuple[int, int], tuple[Topology, CostModel, dict[tuple, float]]] = {}
GROUPS = [0, -1]  # the groups of a dimension bounded (see the module docstring)


class FloorTimer:
    """The `Timer` of a step model whose collectives take their floor: `timer`'s layout,
    placement, topology and cost model, nothing simulated."""

    simulations = 0  # none, ever

    def __init__(self, timer: CommTimer):
        self.timer = timer
        self.per_domain = timer.per_domain
        machine = (id(timer.topo), id(timer.costs))
        if machine not in _FLOORS:
            if len(_FLOORS) >= 8:
                _FLOORS.clear()
            _FLOORS[machine] = (timer.topo, timer.costs, {})
        self._known = _FLOORS[machine][2]

    def layout_key(self) -> tuple:
        return self.timer.layout_key()

    def place(self, rank: int) -> int:
        return self.timer.place(rank)

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        t = self.timer
        n = t.layout.size(dim) if dim != "pp" else 2
        if n <= 1 or nbytes <= 0:
            return 0.0
        # point-to-point sends are one flow a member: those of every group, cheaply, so that
        # their sharing of a fabric's trunks counts
        groups = None if kind == "send" else GROUPS
        return self._floor((kind, dim, algo), nbytes, lambda b: t.tasks(kind, dim, b, algo, groups))

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        t = self.timer
        if t.layout.ep <= 1 or nbytes <= 0:
            return 0.0
        what = ("deepep", combine, sms, top_k, experts)
        return self._floor(
            what, nbytes, lambda b: t.deepep_tasks(b, top_k, experts, combine, sms, GROUPS)
        )

    def _floor(self, what: tuple, nbytes: float, tasks: object) -> float:
        q = max(1, int(round(nbytes / BYTES_QUANTUM)))  # as CommTimer rounds
        key = (*self.timer.layout_key(), *what, q)
        got = self._known.get(key)
        if got is None:
            assert callable(tasks)
            got = collective_floor(tasks(q * BYTES_QUANTUM), self.timer.topo, self.timer.costs)
            if len(self._known) >= FLOORS_MAX:
                self._known.clear()
            self._known[key] = got
        return got


def collective_floor(tasks: list[Task], topo: Topology, costs: CostModel) -> float:
    """Seconds the engine takes at least to run `tasks` (the members' tasks of one or more
    collectives, or send/recv pairs, all launched at 0), by the module docstring's
    argument. A cost model that does not simulate flows (or draws noise) gets 0: no floor
    is claimed for it."""
    if costs.network != "flow" or costs.jitter is not None:
        return 0.0
    by_coll: dict[str, list[Task]] = {}
    for t in tasks:
        by_coll.setdefault(str(t.coll), []).append(t)
    out = 0.0
    sends = [t for ts in by_coll.values() for t in ts if t.kind == "send"]
    if sends:  # pairs started together: their flows share the links as one phase would
        phase = coll_algos.ExplicitPhase(
            np.array([t.rank for t in sends]),
            np.array([t.peer for t in sends]),
            np.array([float(t.bytes) for t in sends]),
        )
        out = phase_floor(phase, topo, costs, 1.0)
    for ts in by_coll.values():
        if ts[0].kind in P2P_KINDS:
            continue
        wire = costs.resources.wire_factor(max(t.sms for t in ts))
        memo: dict[tuple, float] = {}
        total = 0.0
        for ph in coll_algos.phases(ts, topo):
            k = _phase_key(ph)
            if k not in memo:  # a ring's n - 1 steps are one phase n - 1 times
                memo[k] = phase_floor(ph, topo, costs, wire)
            total += memo[k]
        sm = max(costs.resources.comm_floor(t.sms, _kernel_bytes(t)) for t in ts)
        out = max(out, total, sm)
    return out * SLACK


def _kernel_bytes(t: Task) -> float:
    """The bytes the engine's SM floor reads of a member (`Comm._sm_floor`)."""
    return max(t.bytes, float(sum(t.recv_split))) if t.recv_split else t.bytes


def _phase_key(ph: coll_algos.Phase) -> tuple:
    if isinstance(ph, coll_algos.UniformPhase):
        return ("u", ph.members.tobytes(), ph.per_pair, ph.pairs, ph.relay)
    if isinstance(ph, coll_algos.ExplicitPhase):
        return ("e", ph.src.tobytes(), ph.dst.tobytes(), ph.nbytes.tobytes(), ph.relay)
    return ("l", ph.nbytes)


def phase_floor(ph: coll_algos.Phase, topo: Topology, costs: CostModel, wire: float) -> float:
    """Seconds one phase takes at least (see the module docstring)."""
    if isinstance(ph, coll_algos.LocalPhase):  # a memory copy, timed as the engine times it
        copy = Task("floor#copy", 0, "copy", "d2d", bytes=2.0 * ph.nbytes, tags={"dtype": "bf16"})
        return float(costs.compute.duration(copy))
    b = flows(ph, topo, costs.alpha)
    if not len(b):
        return 0.0
    nbytes = b.nbytes * wire
    links, at = np.unique(b.inc_l, return_inverse=True)
    load = np.bincount(at, weights=nbytes[b.inc_b] * b.inc_m, minlength=len(links))
    first = np.full(len(links), np.inf)
    np.minimum.at(first, at, b.latency[b.inc_b])
    cap = topo.link_cap[links]
    on_links = float(np.max(first + load / cap))
    slowest = np.full(len(b), np.inf)
    np.minimum.at(slowest, b.inc_b, cap[at])
    alone = float(np.max(b.latency + nbytes / slowest))
    return max(on_links, alone)


def flows(ph: coll_algos.Phase, topo: Topology, alpha: float) -> BundleBatch:
    """A phase's flows as the engine puts them on the network (`Comm._bundle`; bundled where
    a uniform exchange allows it, which moves the same bytes over the same links)."""
    if isinstance(ph, coll_algos.UniformPhase):
        layout = product_layout(topo, ph.members)
        if layout is not None:
            got = bundled_uniform(topo, *layout, ph.per_pair, alpha, ph.pairs, ph.relay)
            if got is not None:
                return got
        mem = ph.members
        src, dst = np.repeat(mem, len(mem)), np.tile(mem, len(mem))
        keep = pair_mask(topo, src, dst, ph.pairs)
        return per_flow(
            topo, src[keep], dst[keep], np.full(int(keep.sum()), ph.per_pair), alpha, ph.relay
        )
    assert isinstance(ph, coll_algos.ExplicitPhase)
    return per_flow(topo, ph.src, ph.dst, ph.nbytes, alpha, ph.relay)
