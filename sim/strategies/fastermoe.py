"""FasterMoE (He et al., PPoPP'22): smart schedule and dynamic shadowing, with its greedy rule.

Smart schedule (group-wise exchange). The P ranks are cut into n = P/g groups of g
consecutive ranks. Each all-to-all becomes n steps: at step s a rank in group G sends the
tokens meant for the experts of group (G + s) mod n and receives from group (G - s) mod n
(step 0 is its own group). The expert compute of step s starts as soon as that step's
tokens are in, and the combine of step s (outputs back to group G - s) is queued after
that compute, so later steps' exchanges overlap earlier steps' compute. The steps are
queued on the communication stream(s) in one of `sim.strategies.moe.ORDERS`: `tutel` (all
dispatch steps, then all combine steps) is how FastMoE's implementation queues them
(cuda/fastermoe/smart_schedule.h). The backward pass runs the same steps on the gradients.

One step on one rank is g sends and g receives in one NCCL group call (FastMoE); here it is
one all_to_allv whose split is zero outside the step's partner groups. Its members are the
ranks the step chains together: group G talks to G + s and G - s, so the groups with the
same residue modulo gcd(n, s) form one exchange (step 0: each group alone), and no rank
waits for a rank it never talks to, even through others.

Dynamic shadowing. A hot expert's parameters (w1 [M, H], b1 [H], w2 [H, M], b2 [M]) are
broadcast from its owner to every rank before the layer needs them (forward, second
communication stream, pipelined ring broadcast as NCCL's); every rank then runs that
expert on its own tokens, which leave the all-to-all; in backward the shadow copies'
weight gradients are summed over ranks (an all-reduce; the owner keeps the sum). With
`shadow: auto` the choice is FasterMoE's greedy rule (`sim.strategies.fastermoe_rule`) on
the layer's token counts, after an all-gather of the per-expert counts, as FasterMoE does
before deciding.

Token counts come from the layer's routing (`MoELayer.tokens_matrix`): FasterMoE drops no
tokens, so skewed routing shows its load imbalance when the capacity C is at least the
largest per-(rank, expert) count (e.g. capacity_factor = E / top_k makes C = T).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sim.errors import ConfigError
from sim.graph import Task, TaskGraph
from sim.strategies.fastermoe_rule import greedy_shadow, param_bytes, rule_costs
from sim.strategies.moe import (
    PASSES,
    ComputeSteps,
    _t,
    _w,
    comm_order,
    require_whole_experts,
    step_tags,
    task_id,
)
from sim.workload import MoELayer

NAME = "fastermoe"
DEFAULTS: dict[str, Any] = {
    # Ranks per group of the group-wise exchange; FastMoE's default when
    # FMOE_FASTER_GROUP_SIZE is unset is 4, clamped to the world size as FastMoE does
    # (cuda/fastermoe/smart_schedule.cpp).
    "group_size": 4,
    "shadow": "auto",  # "auto" (the greedy rule), "none", or a list of expert ids
    "order": "tutel",  # issue order of the steps (sim.strategies.moe.ORDERS)
}
COUNT_BYTES = 8  # one int64 token count per expert in the count all-gather


# -- parameters --------------------------------------------------------------------------------
def group_layout(world: int, group_size: Any) -> tuple[int, int]:
    """(g, n): ranks per group (clamped to the world size, as FastMoE does) and steps."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ConfigError(f"strategy.group_size: expected a positive integer, got {group_size!r}")
    g = min(group_size, world)
    if world % g:
        raise ConfigError(
            f"strategy.group_size: {group_size} does not divide the {world} ranks into equal "
            f"groups (expected a divisor of {world})"
        )
    return g, world // g


def parse_shadow(value: Any, experts: int) -> str | tuple[int, ...]:
    """'auto', or the shadowed expert ids (sorted, unique); 'none' / None / [] mean none."""
    if value == "auto":
        return "auto"
    if value is None or value == "none":
        return ()
    if not isinstance(value, (list, tuple)) or any(
        not isinstance(e, int) or isinstance(e, bool) for e in value
    ):
        raise ConfigError(
            f"strategy.shadow: expected 'auto', 'none' or a list of expert ids, got {value!r}"
        )
    bad = [e for e in value if not 0 <= e < experts]
    if bad or len(set(value)) != len(value):
        raise ConfigError(
            f"strategy.shadow: expected distinct expert ids in 0..{experts - 1}, got {value!r}"
        )
    return tuple(sorted(value))


def choose_shadow(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any
) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The shadow set to build with, and what the rule saw (for reports)."""
    shadow = parse_shadow(params["shadow"], layer.experts)
    if shadow != "auto":
        return shadow, {"selector": "fixed", "shadow": list(shadow)}  # type: ignore[arg-type]
    costs = rule_costs(layer, cluster)
    chosen, trail = greedy_shadow(
        layer.tokens_matrix,
        layer.local_experts,
        float(layer.model_dim * layer.elem),
        param_bytes(layer),
        costs,
        "bwd" in passes,
    )
    return tuple(chosen), {
        "selector": "greedy",
        "shadow": chosen,
        "predicted_s": trail[-1],
        "predicted_none_s": trail[0],
    }


# -- the graph ---------------------------------------------------------------------------------
@dataclass
class _Layout:
    """Token rows of the layer under a shadow set: rows[p, q] p sends to q (unshadowed)."""

    g: int
    n: int
    shadow: tuple[int, ...]
    tok: np.ndarray  # [P, E]
    rows: np.ndarray  # [P, P]
    members: dict[tuple[int, int], list[int]]  # (step, cycle) -> ranks, one shared list

    def group(self, rank: int) -> int:
        return rank // self.g

    def cycle(self, s: int, rank: int) -> tuple[int, list[int]]:
        d = math.gcd(self.n, s)  # gcd(n, 0) = n: every group alone at step 0
        c = self.group(rank) % d
        return c, self.members[(s, c)]


def _layout(layer: MoELayer, g: int, n: int, shadow: tuple[int, ...]) -> _Layout:
    P, El = layer.world, layer.local_experts
    tok = layer.tokens_matrix.astype(float)
    kept = tok.copy()
    kept[:, list(shadow)] = 0
    rows = kept.reshape(P, P, El).sum(axis=2)  # experts of rank q are q*El .. q*El+El-1
    members: dict[tuple[int, int], list[int]] = {}
    for s in range(n):
        d = math.gcd(n, s)
        for c in range(d):
            members[(s, c)] = [r for r in range(P) if (r // g) % d == c]
    return _Layout(g, n, shadow, tok, rows, members)


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    for p in passes:
        if p not in PASSES:
            raise ConfigError(f"passes: expected entries from {PASSES}, got {p!r}")
    require_whole_experts(layer, NAME)
    g, n = group_layout(layer.world, params["group_size"])
    seq = comm_order(n, params["order"])  # checks the order
    shadow, info = choose_shadow(layer, params, passes, cluster)
    lay = _layout(layer, g, n, shadow)
    graph = TaskGraph(
        layer.world,
        meta={
            "strategy": NAME,
            "group_size": g,
            "steps": n,
            "order": params["order"],
            "shadow": list(shadow),
            "selector": info,
            "passes": list(passes),
            "layer": {f.name: getattr(layer, f.name) for f in fields(layer) if f.name != "routing"}
            | {"routing": layer.routing.get("kind"), "capacity": layer.capacity},
        },
    )
    auto = params["shadow"] == "auto"
    world = list(range(layer.world))
    rings = {o: world[o:] + world[:o] for o in {e // layer.local_experts for e in shadow}}
    for rank in range(layer.world):
        b = _RankBuilder(layer, lay, rank, passes, seq, auto, world, rings)
        for p in passes:
            b.pass_(p)
        for tasks in b.streams.values():
            for t in tasks:
                graph.add(t)
    graph.validate()
    return graph


class _RankBuilder(ComputeSteps):
    def __init__(
        self,
        layer: MoELayer,
        lay: _Layout,
        rank: int,
        passes: tuple[str, ...],
        seq: list[tuple[str, int, str]],
        auto: bool,
        world: list[int],
        rings: dict[int, list[int]],
    ):
        self.l, self.lay, self.rank, self.seq = layer, lay, rank, seq
        self.lid = 0  # FasterMoE builds one layer
        self.auto, self.world, self.rings = auto, world, rings
        self.has_fwd, self.keep = "fwd" in passes, "bwd" in passes
        self.streams: dict[str, list[Task]] = {}
        El = layer.local_experts
        self.active = [
            e for e in range(rank * El, rank * El + El) if e not in set(lay.shadow)
        ]  # my experts whose tokens still come to me

    # -- helpers -----------------------------------------------------------------------------
    def _id(self, phase: str, step: str, j: int | None = None) -> str:
        return task_id(self.rank, 0, phase, step, j)

    def _add(self, stream: str, t: Task) -> str:
        t.tags.setdefault("dtype", self.l.dtype)
        t.tags.setdefault("layer", 0)
        self.streams.setdefault(stream, []).append(t)
        return t.id

    def _step_rows(self, s: int) -> float:
        """Token rows my experts get at step s (from group G - s)."""
        lay = self.lay
        src = (lay.group(self.rank) - s) % lay.n
        ranks = range(src * lay.g, (src + 1) * lay.g)
        return float(sum(lay.rows[p, self.rank] for p in ranks))

    def _exchange(
        self,
        phase: str,
        step: str,
        s: int,
        stream: str,
        deps: list[str],
        back: bool,
        allocs: dict | None = None,
        frees: list[str] | None = None,
    ) -> Task:
        """Step s of an exchange: to group G + s (from G - s); `back` reverses it (outputs
        return to the ranks whose tokens they are)."""
        lay, r, rb = self.lay, self.rank, self.l.model_dim * self.l.elem
        c, members = lay.cycle(s, r)
        G = lay.group(r)
        fwd_to, fwd_from = (G + s) % lay.n, (G - s) % lay.n
        if not back:
            split = [lay.rows[r, m] * rb if lay.group(m) == fwd_to else 0.0 for m in members]
            recv = [lay.rows[m, r] * rb if lay.group(m) == fwd_from else 0.0 for m in members]
        else:
            split = [lay.rows[m, r] * rb if lay.group(m) == fwd_from else 0.0 for m in members]
            recv = [lay.rows[r, m] * rb if lay.group(m) == fwd_to else 0.0 for m in members]
        return Task(
            self._id(phase, step, s),
            r,
            stream,
            "all_to_allv",
            deps=deps,
            bytes=float(sum(split)),
            group=members,
            coll=f"L0/{phase}/{step}.{s}/c{c}",
            split=split,
            recv_split=recv,
            allocs=allocs or {},
            frees=frees or [],
            tags=step_tags(0, phase, step, s),
        )

    def _shapes(self, s: int) -> tuple[dict, dict] | None:
        """fc1 / fc2 shapes of step s, as sim.strategies.moe sizes them (None: no rows)."""
        l, lay = self.l, self.lay
        rows = self._step_rows(s)
        if rows <= 0:
            return None
        if l.uniform:
            m, b = lay.g * l.capacity, len(self.active)
        else:
            m, b = int(rows), 1
        return (
            {"batch": b, "m": m, "n": l.hidden_dim, "k": l.model_dim},
            {"batch": b, "m": m, "n": l.model_dim, "k": l.hidden_dim},
        )

    def _gemm_bytes(self, s: dict) -> float:
        b, m, n, k = s["batch"], s["m"], s["n"], s["k"]
        return float(self.l.elem * b * (m * k + m * n + k * n))

    @staticmethod
    def _flops(s: dict) -> float:
        return 2.0 * s["batch"] * s["m"] * s["n"] * s["k"]

    def _shadow_shapes(self, e: int) -> tuple[dict, dict] | None:
        rows = int(self.lay.tok[self.rank, e])
        if rows <= 0:
            return None
        l = self.l
        return (
            {"batch": 1, "m": rows, "n": l.hidden_dim, "k": l.model_dim},
            {"batch": 1, "m": rows, "n": l.model_dim, "k": l.hidden_dim},
        )

    # -- passes ------------------------------------------------------------------------------
    def pass_(self, phase: str) -> None:
        l, e = self.l, self.l.elem
        T, M, E, C = l.tokens, l.model_dim, l.experts, l.capacity
        fwd = phase == "fwd"
        gate_flops = 2.0 * T * M * E * (1 if fwd else 2)
        gate_bytes = float(e * (T * M + M * E) + 4 * T * E)
        buf = float(e * E * C * M)
        first_step, second_step = (
            ("dispatch", "combine") if fwd else ("combine_grad", "dispatch_grad")
        )
        shadow_done: list[str] = []
        if fwd:
            gate = self._compute(phase, "gate", "gate", gate_flops, gate_bytes, [])
            head = self._compute(phase, "encode", "encode", 0.0, float(e * T * M) + buf, [gate])
            ready = gate
            if self.auto:  # FasterMoE all-gathers the counts before choosing what to shadow
                ready = self._add(
                    "comm",
                    Task(
                        self._id(phase, "counts"),
                        self.rank,
                        "comm",
                        "all_gather",
                        deps=[gate],
                        bytes=float(E * COUNT_BYTES),
                        group=self.world,
                        coll="L0/fwd/counts",
                        tags=step_tags(0, phase, "counts"),
                    ),
                )
            bcast = {}
            for x in self.lay.shadow:
                o = x // l.local_experts
                bcast[x] = self._add(
                    "comm.1",
                    Task(
                        self._id(phase, "shadow_bcast", x),
                        self.rank,
                        "comm.1",
                        "broadcast",
                        deps=[ready],
                        bytes=param_bytes(l),
                        group=self.rings[o],
                        algo="ring",
                        coll=f"L0/fwd/shadow_bcast.{x}",
                        allocs={f"shadow.{x}": param_bytes(l)},
                        tags=step_tags(0, phase, "shadow_bcast") | {"expert": x},
                    ),
                )
        else:
            head = self._compute(phase, "decode_grad", "encode", 0.0, float(e * T * M) + buf, [])
            # Shadow backward first: its gradient all-reduce then overlaps the steps.
            for x in self.lay.shadow:
                last = head
                shapes = self._shadow_shapes(x)
                if shapes is not None:
                    fc1, fc2 = shapes
                    d2 = self._compute(
                        phase,
                        "shadow_fc2_dgrad",
                        "gemm",
                        self._flops(fc2),
                        self._gemm_bytes(fc2),
                        [head],
                        x,
                        _t(fc2),
                    )
                    w2 = self._compute(
                        phase,
                        "shadow_fc2_wgrad",
                        "gemm",
                        self._flops(fc2),
                        self._gemm_bytes(fc2),
                        [d2],
                        x,
                        _w(fc2),
                        frees=[f"smid.{x}"] if self.has_fwd else [],
                    )
                    d1 = self._compute(
                        phase,
                        "shadow_fc1_dgrad",
                        "gemm",
                        self._flops(fc1),
                        self._gemm_bytes(fc1),
                        [w2],
                        x,
                        _t(fc1),
                    )
                    last = self._compute(
                        phase,
                        "shadow_fc1_wgrad",
                        "gemm",
                        self._flops(fc1),
                        self._gemm_bytes(fc1),
                        [d1],
                        x,
                        _w(fc1),
                    )
                    shadow_done.append(d1)
                self._add(
                    "comm.1",
                    Task(
                        self._id(phase, "shadow_reduce", x),
                        self.rank,
                        "comm.1",
                        "all_reduce",
                        deps=[last],
                        bytes=param_bytes(l),
                        group=self.world,
                        coll=f"L0/bwd/shadow_reduce.{x}",
                        frees=[f"shadow.{x}"] if self.has_fwd else [],
                        tags=step_tags(0, phase, "shadow_reduce") | {"expert": x},
                    ),
                )
        # Exchanges are created first and queued in issue order at the end: the second
        # exchange of a step depends on compute tasks that must exist by id first.
        n = self.lay.n
        rb = float(M * e)
        first: dict[int, Task] = {}
        for what, s, stream in self.seq:
            if what == "first":
                rows = self._step_rows(s)
                allocs = {f"di.{s}": rows * rb} if fwd and rows > 0 else None
                first[s] = self._exchange(
                    phase, first_step, s, stream, [head], back=False, allocs=allocs
                )
        last_of: dict[int, str] = {}
        for s in range(n):
            shapes = self._shapes(s)
            if shapes is None:
                last_of[s] = first[s].id
                continue
            fc1, fc2 = shapes
            got = first[s].id
            if fwd:
                mid = float(e * fc1["batch"] * fc1["m"] * fc1["n"])
                a = self._compute(
                    phase,
                    "fc1",
                    "gemm",
                    self._flops(fc1),
                    self._gemm_bytes(fc1),
                    [got],
                    s,
                    fc1,
                    allocs={f"mid.{s}": mid},
                )
                last_of[s] = self._compute(
                    phase,
                    "fc2",
                    "gemm",
                    self._flops(fc2),
                    self._gemm_bytes(fc2),
                    [a],
                    s,
                    fc2,
                    allocs={f"do.{s}": self._step_rows(s) * rb},
                    frees=[] if self.keep else [f"di.{s}", f"mid.{s}"],
                )
            else:
                d2 = self._compute(
                    phase,
                    "fc2_dgrad",
                    "gemm",
                    self._flops(fc2),
                    self._gemm_bytes(fc2),
                    [got],
                    s,
                    _t(fc2),
                )
                w2 = self._compute(
                    phase,
                    "fc2_wgrad",
                    "gemm",
                    self._flops(fc2),
                    self._gemm_bytes(fc2),
                    [d2],
                    s,
                    _w(fc2),
                    frees=[f"mid.{s}"] if self.has_fwd else [],
                )
                d1 = self._compute(
                    phase,
                    "fc1_dgrad",
                    "gemm",
                    self._flops(fc1),
                    self._gemm_bytes(fc1),
                    [w2],
                    s,
                    _t(fc1),
                )
                last_of[s] = self._compute(
                    phase,
                    "fc1_wgrad",
                    "gemm",
                    self._flops(fc1),
                    self._gemm_bytes(fc1),
                    [d1],
                    s,
                    _w(fc1),
                    frees=[f"di.{s}"] if self.has_fwd else [],
                )

        if fwd:
            # Shadowed experts on my own tokens, once their parameters are in; after the
            # steps, so a late broadcast never holds up the steps' compute.
            for x in self.lay.shadow:
                shapes = self._shadow_shapes(x)
                if shapes is None:
                    continue
                fc1, fc2 = shapes
                a = self._compute(
                    phase,
                    "shadow_fc1",
                    "gemm",
                    self._flops(fc1),
                    self._gemm_bytes(fc1),
                    [bcast[x], head],
                    x,
                    fc1,
                    allocs={f"smid.{x}": float(e * fc1["m"] * fc1["n"])},
                )
                shadow_done.append(
                    self._compute(
                        phase,
                        "shadow_fc2",
                        "gemm",
                        self._flops(fc2),
                        self._gemm_bytes(fc2),
                        [a],
                        x,
                        fc2,
                        frees=[] if self.keep else [f"smid.{x}", f"shadow.{x}"],
                    )
                )

        second: dict[int, Task] = {}
        for what, s, stream in self.seq:
            if what == "second":
                has_out = fwd and self._shapes(s) is not None
                second[s] = self._exchange(
                    phase,
                    second_step,
                    s,
                    stream,
                    [last_of[s]],
                    back=True,
                    frees=[f"do.{s}"] if has_out else None,
                )

        for what, s, stream in self.seq:
            self._add(stream, first[s] if what == "first" else second[s])
        tail = [second[s].id for s in range(n)] + shadow_done
        if fwd:
            self._compute(
                phase, "decode", "decode", float(2 * T * M * l.top_k), buf + float(e * T * M), tail
            )
            if not self.keep:
                for x in self.lay.shadow:
                    if self._shadow_shapes(x) is None:  # nothing used it: freed right away
                        self.streams["compute"][-1].frees.append(f"shadow.{x}")
        else:
            enc = self._compute(phase, "encode_grad", "decode", 0.0, buf + float(e * T * M), tail)
            self._compute(phase, "gate_grad", "gate", gate_flops, gate_bytes, [enc])
