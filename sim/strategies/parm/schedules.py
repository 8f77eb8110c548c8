"""Parm's schedules of one MoE layer as task graphs: the MP+EP+ESP baseline, PauseMP S1 and
S2 with the EP&ESP-AlltoAll (local dump before it, local combine after), and SAA.

Each pass is one chain per rank (every step waits for the one before it), as the paper's
Fig. 3 draws it; only SAA overlaps: S2's second all-to-all is cut into N_EP rounds (round j
brings the partial outputs of the experts at EP index e+j from their N_ESP slices, Fig. 5's
phases grouped by source expert), each round's local combine runs as soon as it lands, and
its MP-AllGather goes out on a second communication stream (`comm.1`) while the next round
of the all-to-all runs on `comm`. Bytes are those of `sim.strategies.parm.volumes`.

Ids and tags follow `sim.strategies.steps` (r{rank}/L0/{phase}/{step}[.{round}]).
"""

from __future__ import annotations

from typing import Any

from sim.core.graph import Task, TaskGraph
from sim.strategies.activations import place
from sim.strategies.parm.volumes import Degrees, Volumes
from sim.strategies.steps import dgrad_shape, step_tags, task_id, wgrad_shape
from sim.workload.memory import layer_tensors
from sim.workload.moe import MoELayer
from sim.workload.parallel import ParallelLayout
from sim.workload.slicing import layer_meta

LID = 0
Dep = str | list[str] | None  # what a chain's next step waits for


def build_schedule(
    layer: MoELayer,
    vol: Volumes,
    passes: tuple[str, ...],
    saa: bool = False,
    algo: str | None = None,
) -> TaskGraph:
    """The graph of one replica (`layer.world` = N_EP * N_ESP ranks) for `vol.schedule`;
    `saa` applies to S2 only (the paper's S1 has no all-to-all next to its MP-AllGather)."""
    deg = vol.deg
    lay = ParallelLayout(ep=deg.ep, esp=deg.esp, tp=deg.mp, tp_overlay=True)
    g = TaskGraph(
        layer.world,
        meta={
            "strategy": "parm",
            "schedule": vol.schedule,
            "saa": bool(saa and vol.schedule == "s2"),
            "algo": algo,
            "passes": list(passes),
            "layer": layer_meta(layer),
            "parallel": {"ep": deg.ep, "esp": deg.esp, "tp": deg.mp, "tp_overlay": True},
        },
    )
    groups: dict[tuple[int, ...], list[int]] = {}  # one shared list per group
    for rank in range(layer.world):
        b = _Rank(layer, vol, lay, rank, groups, saa and vol.schedule == "s2", algo)
        last: Dep = None
        for p in passes:
            last = b.pass_(p, last)
        # the layer's tensors (sim.strategies.activations): T_I, T_O the rank's [E, C', M]
        # buffer, its experts' N_ESP |D| rows of M (T_DI, T_DO) and of H / N_ESP (T_M)
        rows = vol.local_experts * vol.rows
        mem = layer_tensors(
            layer.experts * vol.capacity, rows, layer.model_dim, vol.hidden, layer.elem
        )
        place(b.tasks, mem, passes)
        for t in b.tasks:
            g.add(t)
    g.validate()
    return g


class _Rank:
    def __init__(
        self,
        layer: MoELayer,
        vol: Volumes,
        lay: ParallelLayout,
        rank: int,
        groups: dict[tuple[int, ...], list[int]],
        saa: bool,
        algo: str | None,
    ):
        self.l, self.v, self.lay, self.rank = layer, vol, lay, rank
        self.saa, self.algo, self._groups = saa, algo, groups
        self.tasks: list[Task] = []
        self.deg: Degrees = vol.deg

    # -- pieces ----------------------------------------------------------------------------
    def _group(self, kind: str) -> list[int]:
        pick = {
            "ep": self.lay.ep_group,
            "esp": self.lay.esp_group,
            "mp": self.lay.tp_group,
            "moe": self.lay.moe_group,
        }
        members = pick[kind](self.rank)
        return self._groups.setdefault(tuple(members), members)

    def _task(
        self,
        phase: str,
        step: str,
        stream: str,
        kind: str,
        deps: list[str],
        j: int | None = None,
        **kw: Any,
    ) -> str:
        t = Task(task_id(self.rank, LID, phase, step, j), self.rank, stream, kind, deps=deps, **kw)
        t.tags = step_tags(LID, phase, step, j) | {"dtype": self.l.dtype} | t.tags
        self.tasks.append(t)
        return t.id

    def _local(
        self, phase: str, step: str, nbytes: float, dep: Dep, j: int | None = None, **kw: Any
    ) -> str:
        """A local memory pass (split, dump, combine): bytes read + written."""
        return self._task(phase, step, "compute", "elementwise", _d(dep), j, bytes=nbytes, **kw)

    def _coll(
        self,
        phase: str,
        step: str,
        kind: str,
        group: str,
        nbytes: float,
        dep: Dep,
        stream: str = "comm",
        j: int | None = None,
        **kw: Any,
    ) -> str:
        members = self._group(group)
        coll = f"L{LID}/{phase}/{step}" + ("" if j is None else f".{j}") + f"@{group}{members[0]}"
        algo = self.algo if kind == "all_to_all" else None
        return self._task(
            phase,
            step,
            stream,
            kind,
            _d(dep),
            j,
            bytes=nbytes,
            group=members,
            coll=coll,
            algo=algo,
            **kw,
        )

    def _gate(self, phase: str, dep: Dep) -> str:
        T, M, E, e = self.v.gate_tokens, self.l.model_dim, self.l.experts, self.l.elem
        flops = 2.0 * T * M * E * (1 if phase == "fwd" else 2)
        nbytes = float(e * (T * M + M * E) + 4 * T * E)
        step = "gate" if phase == "fwd" else "gate_grad"
        return self._task(phase, step, "compute", "gate", _d(dep), flops=flops, bytes=nbytes)

    def _layout_op(self, phase: str, step: str, kind: str, dep: Dep) -> str:
        """encode / decode and their gradients: the tokens <-> [E, C, M] buffer."""
        T, M, e = self.v.gate_tokens, self.l.model_dim, self.l.elem
        full = float(self.l.experts * self.v.full_capacity * M * e)
        flops = float(2 * T * M * self.l.top_k) if step == "decode" else 0.0
        return self._task(
            phase, step, "compute", kind, _d(dep), flops=flops, bytes=full + float(e * T * M)
        )

    def _experts(self, phase: str, dep: Dep) -> str:
        v, M, e = self.v, self.l.model_dim, self.l.elem
        fc1 = {"batch": v.local_experts, "m": v.rows, "n": v.hidden, "k": M}
        fc2 = {"batch": v.local_experts, "m": v.rows, "n": M, "k": v.hidden}
        work = 2.0 * v.local_experts * v.rows * v.hidden * M  # flops of one GEMM

        def gemm(step: str, sizes: dict, shape: dict, d: Dep, **kw: Any) -> str:
            """A GEMM of `sizes`' work, run in `shape`'s layout (dgrad / wgrad views)."""
            return self._task(
                phase,
                step,
                "compute",
                "gemm",
                _d(d),
                flops=work,
                bytes=_gb(e, sizes),
                shape=shape,
                **kw,
            )

        if phase == "fwd":
            return gemm("fc2", fc2, fc2, gemm("fc1", fc1, fc1, dep))
        d2 = gemm("fc2_dgrad", fc2, dgrad_shape(fc2), dep)
        w2 = gemm("fc2_wgrad", fc2, wgrad_shape(fc2), d2)
        d1 = gemm("fc1_dgrad", fc1, dgrad_shape(fc1), w2)
        return gemm("fc1_wgrad", fc1, wgrad_shape(fc1), d1)

    # -- passes ----------------------------------------------------------------------------
    def pass_(self, phase: str, head: Dep) -> Dep:
        """One pass as a chain after `head` (the forward's last task); its last task(s)."""
        return getattr(self, f"_{self.v.schedule}")(phase, head)

    def _baseline(self, phase: str, x: Dep) -> Dep:
        n, d = self.deg.esp, self.v.buf
        sliced = n > 1  # an ESP group of one rank runs no ESP collective or split
        if phase == "fwd":
            x = self._gate(phase, x)
            x = self._layout_op(phase, "encode", "encode", x)
            if sliced:
                x = self._coll(phase, "esp_gather", "all_gather", "esp", d, x)
            x = self._coll(phase, "dispatch", "all_to_all", "ep", n * d, x)
            x = self._experts(phase, x)
            if sliced:
                x = self._coll(phase, "esp_reduce", "all_reduce", "esp", n * d, x)
            x = self._coll(phase, "combine", "all_to_all", "ep", n * d, x)
            if sliced:
                x = self._local(phase, "esp_split", 2 * d, x)
            return self._layout_op(phase, "decode", "decode", x)
        x = self._layout_op(phase, "decode_grad", "encode", x)
        if sliced:
            x = self._coll(phase, "esp_split_grad", "all_gather", "esp", d, x)
        x = self._coll(phase, "combine_grad", "all_to_all", "ep", n * d, x)
        x = self._experts(phase, x)
        x = self._coll(phase, "dispatch_grad", "all_to_all", "ep", n * d, x)
        if sliced:
            x = self._coll(phase, "esp_gather_grad", "reduce_scatter", "esp", n * d, x)
        x = self._layout_op(phase, "encode_grad", "decode", x)
        return self._gate(phase, x)

    def _s1(self, phase: str, x: Dep) -> Dep:
        mp, shard = self.deg.mp, self.v.mp_gather
        if phase == "fwd":
            if mp > 1:
                x = self._local(phase, "mp_split", 2 * shard, x)
            x = self._gate(phase, x)
            x = self._layout_op(phase, "encode", "encode", x)
            x = self._exchange(phase, "dispatch", x)
            x = self._experts(phase, x)
            x = self._exchange(phase, "combine", x)
            x = self._layout_op(phase, "decode", "decode", x)
            return self._coll(phase, "mp_gather", "all_gather", "mp", shard, x) if mp > 1 else x
        if mp > 1:
            x = self._local(phase, "mp_gather_grad", 2 * shard, x)
        x = self._layout_op(phase, "decode_grad", "encode", x)
        x = self._exchange(phase, "combine_grad", x)
        x = self._experts(phase, x)
        x = self._exchange(phase, "dispatch_grad", x)
        x = self._layout_op(phase, "encode_grad", "decode", x)
        x = self._gate(phase, x)
        return self._coll(phase, "mp_split_grad", "all_gather", "mp", shard, x) if mp > 1 else x

    def _s2(self, phase: str, x: Dep) -> Dep:
        mp, d = self.deg.mp, self.v.buf
        if phase == "fwd":
            x = self._gate(phase, x)
            x = self._layout_op(phase, "encode", "encode", x)
            if mp > 1:
                x = self._local(phase, "mp_split", 2 * d, x)
            x = self._exchange(phase, "dispatch", x)
            x = self._experts(phase, x)
            x = self._return(phase, "combine", "mp_gather", x)
            return self._layout_op(phase, "decode", "decode", x)
        x = self._layout_op(phase, "decode_grad", "encode", x)
        if mp > 1:
            x = self._local(phase, "mp_gather_grad", 2 * d, x)
        x = self._exchange(phase, "combine_grad", x)
        x = self._experts(phase, x)
        x = self._return(phase, "dispatch_grad", "mp_split_grad", x)
        x = self._layout_op(phase, "encode_grad", "decode", x)
        return self._gate(phase, x)

    # -- the EP&ESP-AlltoAll with its local dump / combine ----------------------------------
    def _exchange(self, phase: str, step: str, x: Dep) -> Dep:
        """Dump (N_ESP copies of the buffer, one per slice of each expert) before an outgoing
        EP&ESP-AlltoAll; local combine (sum of the N_ESP partial outputs) after a returning
        one. Forward: dispatch goes out, combine returns; backward: combine_grad goes out,
        dispatch_grad returns."""
        n, d = self.deg.esp, self.v.buf
        out = step in ("dispatch", "combine_grad")
        if out and n > 1:
            x = self._local(
                phase, "dump" if step == "dispatch" else "local_combine_grad", (1 + n) * d, x
            )
        x = self._coll(phase, step, "all_to_all", "moe", n * d, x)
        if not out and n > 1:
            x = self._local(
                phase, "local_combine" if step == "combine" else "dump_grad", (1 + n) * d, x
            )
        return x

    def _return(self, phase: str, step: str, gather: str, x: Dep) -> Dep:
        """S2's returning EP&ESP-AlltoAll and MP-AllGather: in sequence, or as SAA."""
        mp, n, d = self.deg.mp, self.deg.esp, self.v.buf
        if not self.saa or mp == 1:
            x = self._exchange(phase, step, x)
            return self._coll(phase, gather, "all_gather", "mp", d, x) if mp > 1 else x
        ep, El = self.deg.ep, self.v.local_experts
        per_peer = float(El * self.v.capacity * self.l.model_dim * self.l.elem)
        members = self._group("moe")
        my_ep = self.lay.coords(self.rank)["ep"]
        peer_ep = [self.lay.coords(q)["ep"] for q in members]
        combine = "local_combine" if step == "combine" else "dump_grad"
        gathers: list[str] = []
        for j in range(ep):  # round j: outputs of the experts at EP index my_ep + j come back
            send = [per_peer if (p - my_ep + j) % ep == 0 else 0.0 for p in peer_ep]
            recv = [per_peer if (p - my_ep - j) % ep == 0 else 0.0 for p in peer_ep]
            coll = f"L{LID}/{phase}/{step}.{j}@moe{members[0]}"
            x = self._task(
                phase,
                step,
                "comm",
                "all_to_allv",
                _d(x),
                j,
                bytes=sum(send),
                split=send,
                recv_split=recv,
                group=members,
                coll=coll,
            )
            c = self._local(phase, combine, (1 + n) * d / ep, x, j) if n > 1 else x
            gathers.append(
                self._coll(phase, gather, "all_gather", "mp", d / ep, c, stream="comm.1", j=j)
            )
        return gathers  # the rounds land in one buffer: the next step waits for all


def _d(dep: Dep) -> list[str]:
    if dep is None:
        return []
    return [dep] if isinstance(dep, str) else list(dep)


def _gb(e: float, s: dict) -> float:
    b, m, n, k = s["batch"], s["m"], s["n"], s["k"]
    return float(e * b * (m * k + m * n + k * n))
