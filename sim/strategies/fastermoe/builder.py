"""FasterMoE's task graph: per-rank steps of the group-wise exchange, shadowed experts'
broadcast and local compute (see the package doc)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.core.graph import Task
from sim.strategies.fastermoe.rule import param_bytes
from sim.strategies.steps import ComputeSteps, dgrad_shape, step_tags, task_id, wgrad_shape
from sim.workload.moe import MoELayer

COUNT_BYTES = 8  # one int64 token count per expert in the count all-gather


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
        """fc1 / fc2 shapes of step s, as sim.strategies.layer sizes them (None: no rows)."""
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
                        dgrad_shape(fc2),
                    )
                    w2 = self._compute(
                        phase,
                        "shadow_fc2_wgrad",
                        "gemm",
                        self._flops(fc2),
                        self._gemm_bytes(fc2),
                        [d2],
                        x,
                        wgrad_shape(fc2),
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
                        dgrad_shape(fc1),
                    )
                    last = self._compute(
                        phase,
                        "shadow_fc1_wgrad",
                        "gemm",
                        self._flops(fc1),
                        self._gemm_bytes(fc1),
                        [d1],
                        x,
                        wgrad_shape(fc1),
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
                    dgrad_shape(fc2),
                )
                w2 = self._compute(
                    phase,
                    "fc2_wgrad",
                    "gemm",
                    self._flops(fc2),
                    self._gemm_bytes(fc2),
                    [d2],
                    s,
                    wgrad_shape(fc2),
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
                    dgrad_shape(fc1),
                )
                last_of[s] = self._compute(
                    phase,
                    "fc1_wgrad",
                    "gemm",
                    self._flops(fc1),
                    self._gemm_bytes(fc1),
                    [d1],
                    s,
                    wgrad_shape(fc1),
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
