"""MPipeMoE's task graph for a given granularity n and reuse strategy (see the package doc)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.activations import place
from sim.strategies.chunking import comm_order
from sim.strategies.mpipemoe.chunks import Chunk, _dgrad, _flops, _gemm_bytes, _wgrad, chunk_plan
from sim.strategies.mpipemoe.perf import RESTORE
from sim.strategies.steps import PASSES, compute_task, require_whole_experts, step_tags, task_id
from sim.workload.memory import footprint, layer_tensors
from sim.workload.moe import MoELayer
from sim.workload.slicing import layer_meta

NAME = "mpipemoe"
ORDER = "alternating"

# -- the graph ---------------------------------------------------------------------------------


def check_params(layer: MoELayer, params: dict[str, Any]) -> None:
    require_whole_experts(layer, NAME)
    deg = params["degree"]
    if deg != "auto":
        if not isinstance(deg, int) or isinstance(deg, bool) or deg < 1:
            raise ConfigError(
                f"strategy.degree: expected a positive integer or 'auto', got {deg!r}"
            )
        if deg > layer.capacity:
            raise ConfigError(
                f"strategy.degree: {deg} micro-batches exceed the expert capacity "
                f"C={layer.capacity}"
            )
    reuse = params["reuse"]
    if reuse != "auto" and reuse not in RESTORE:
        raise ConfigError(f"strategy.reuse: expected one of {[*RESTORE, 'auto']}, got {reuse!r}")


def build_graph(
    layer: MoELayer,
    degree: int,
    reuse: str,
    passes: tuple[str, ...],
    algo: str | None = None,
    layer_id: int = 0,
) -> TaskGraph:
    check_params(layer, {"degree": degree, "reuse": reuse})
    for p in passes:
        if p not in PASSES:
            raise ConfigError(f"passes: expected entries from {PASSES}, got {p!r}")
    if "fwd" not in passes:
        raise ConfigError(
            "passes: mpipemoe's backward restores what its forward stashed; include 'fwd'"
        )
    plan = chunk_plan(layer, degree)
    fp = footprint(
        layer.experts * layer.capacity,
        layer.model_dim,
        layer.hidden_dim,
        layer.experts,
        degree,
        layer.local_experts,
    )
    g = TaskGraph(
        layer.world,
        meta={
            "strategy": NAME,
            "degree": degree,
            "order": ORDER,
            "reuse": reuse,
            "algo": algo,
            "passes": list(passes),
            "layer": layer_meta(layer),
            "memory_model_bytes": {  # Eq. 1-6 for B = E*C rows (sim.workload.memory)
                "model_states": fp.model_states * layer.elem,
                "activations": fp.activations * layer.elem,
                "buffers": fp.buffers * layer.elem,
                "saving_act": fp.saving_act * layer.elem,
                "ratio": fp.ratio,
            },
        },
    )
    group = list(range(layer.world))
    for rank in range(layer.world):
        b = _Rank(layer, plan, rank, reuse, "bwd" in passes, group, algo, layer_id)
        b.forward()
        if "bwd" in passes:
            b.backward()
        place([t for ts in b.streams.values() for t in ts], b.nbytes(), passes, buffer=b.slot)
        for tasks in b.streams.values():
            for t in tasks:
                g.add(t)
    g.validate()
    return g


class _Rank:
    """One rank's tasks, stream by stream in program order."""

    def __init__(
        self,
        layer: MoELayer,
        plan: list[Chunk],
        rank: int,
        reuse: str,
        backward: bool,
        group: list[int],
        algo: str | None,
        lid: int,
    ):
        self.l, self.plan, self.rank, self.reuse = layer, plan, rank, reuse
        self.n = len(plan)
        self.bwd, self.group, self.algo, self.lid = backward, group, algo, lid
        self.ring = reuse != "none"
        self.di_how, self.m_how = RESTORE[reuse]
        self.streams: dict[str, list[Task]] = defaultdict(list)
        # slots per ring: one for T_M / dT_M, two (one communicated, one computed) for the rest
        self.double = min(2, self.n)
        e, M = layer.elem, layer.model_dim
        self.io_bytes = float(layer.experts * layer.capacity * M * e)  # T_I, T_O: [E, C, M]
        # model states (Eq. 1) are not allocated here: every strategy's summary counts them
        # alike, beside the activations (sim.workload.accounting), so that peaks compare

    # -- memory: the tensors every builder allocates, here with MPipeMoE's ring slots ---------
    def slot(self, tensor: str, t: Task) -> str:
        """The buffer task `t` writes or reads of `tensor`: the whole tensor without reuse
        (every micro-batch its slice, Eq. 4), else ring slot p mod slots for the micro-batch
        processed p-th (backward: in reverse), Eq. 5."""
        slots = self._slots().get(tensor)
        if slots is None:
            return tensor
        j = int(t.tags["chunk"])
        p = j if t.tags["phase"] == "fwd" else self.n - 1 - j
        return f"{tensor}.{p % slots}"

    def _slots(self) -> dict[str, int]:
        if not self.ring:
            return {}
        d = self.double
        return {"T_DI": d, "T_M": 1, "T_DO": d, "dT_DO": d, "dT_M": 1, "dT_DI": d}

    def nbytes(self) -> dict[str, float]:
        """Bytes of each buffer: the layer's tensors (`sim.workload.memory.layer_tensors`),
        a ring slot the size of the largest micro-batch's slice."""
        r, l = self.rank, self.l
        rows = [float(c.rows[r]) for c in self.plan]
        out = layer_tensors(l.experts * l.capacity, sum(rows), l.model_dim, l.hidden_dim, l.elem)
        one = layer_tensors(l.experts * l.capacity, max(rows), l.model_dim, l.hidden_dim, l.elem)
        for tensor, slots in self._slots().items():
            del out[tensor]
            out |= {f"{tensor}.{s}": one[tensor] for s in range(slots)}
        return out

    # -- helpers ---------------------------------------------------------------------------
    def _id(self, phase: str, step: str, j: int | None = None) -> str:
        return task_id(self.rank, self.lid, phase, step, j)

    def _add(self, t: Task, phase: str, step: str, j: int | None) -> Task:
        t.tags = step_tags(self.lid, phase, step, j) | {"dtype": self.l.dtype}
        if self.reuse != "none":
            t.tags["reuse"] = self.reuse
        self.streams[t.stream].append(t)
        return t

    def _compute(
        self,
        phase: str,
        step: str,
        j: int | None,
        kind: str,
        flops: float,
        nbytes: float,
        deps: list[str],
        shape: dict | None = None,
    ) -> Task:
        t = compute_task(self.rank, self.lid, phase, step, kind, flops, nbytes, deps, j, shape)
        return self._add(t, phase, step, j)

    def _gemm(self, phase: str, step: str, j: int, shape: dict, deps: list[str]):
        return self._compute(
            phase, step, j, "gemm", _flops(shape), _gemm_bytes(shape, self.l.elem), deps, shape
        )

    def _comm(self, phase: str, step: str, j: int, deps: list[str], reverse: bool) -> Task:
        c = self.plan[j]
        t = c.exchange(
            self.rank,
            self._id(phase, step, j),
            f"L{self.lid}/{phase}/{step}.{j}",
            self.group,
            self.algo,
            reverse,
        )
        t.deps = deps
        return self._add(t, phase, step, j)

    def _copy(self, kind: str, phase: str, step: str, j: int, nbytes: float, deps: list[str]):
        t = Task(self._id(phase, step, j), self.rank, "copy", kind, deps=deps, bytes=nbytes)
        return self._add(t, phase, step, j)

    # -- forward -----------------------------------------------------------------------------
    def forward(self) -> None:
        l, e, T, M, E, n = (
            self.l,
            self.l.elem,
            self.l.tokens,
            self.l.model_dim,
            self.l.experts,
            self.n,
        )
        P = "fwd"
        ring, offload_di, offload_m = self.ring, self.di_how == "offload", self.m_how == "offload"
        offload_di &= self.bwd  # copies exist for the backward's sake
        offload_m &= self.bwd
        gate_bytes = float(e * (T * M + M * E) + 4 * T * E)
        gate = self._compute(
            P,
            "gate",
            None,
            "gate",
            2.0 * T * M * E,
            gate_bytes,
            [],
        )
        enc = self._compute(
            P,
            "encode",
            None,
            "encode",
            0.0,
            float(e * T * M) + self.io_bytes,
            [gate.id],
        )
        S, R = (lambda j: self._id(P, "dispatch", j)), (lambda j: self._id(P, "combine", j))
        F1, F2 = (lambda j: self._id(P, "fc1", j)), (lambda j: self._id(P, "fc2", j))
        DDI, DM = (lambda j: self._id(P, "offload_di", j)), (lambda j: self._id(P, "offload_m", j))
        for j in range(n):
            fc1, fc2 = self.plan[j].shapes(self.rank)
            deps = [S(j)]
            if ring and offload_m and j >= 1:  # the single T_M slot holds j-1 until offloaded
                deps.append(DM(j - 1))
            self._gemm(P, "fc1", j, fc1, deps)
            if offload_di and j < n - self.double:  # the last two stay in their slots
                self._copy(
                    "d2h", P, "offload_di", j, float(self.plan[j].di_bytes[self.rank]), [S(j)]
                )
            if offload_m and j < n - 1:  # the last stays in the T_M slot
                self._copy(
                    "d2h", P, "offload_m", j, float(self.plan[j].m_bytes[self.rank]), [F1(j)]
                )
            deps = [F1(j)]
            if ring and j >= self.double:  # T_DO slot: combine of j-2 has read it
                deps.append(R(j - self.double))
            self._gemm(P, "fc2", j, fc2, deps)
        for what, j, _ in comm_order(n, ORDER):
            if what == "first":
                deps = [enc.id]
                if ring and j >= self.double:  # T_DI slot: fc1 (and its offload) of j-2 done
                    deps.append(F1(j - self.double))
                    if offload_di:
                        deps.append(DDI(j - self.double))
                self._comm(P, "dispatch", j, deps, reverse=False)
            else:
                self._comm(P, "combine", j, [F2(j)], reverse=True)
        self._compute(
            P,
            "decode",
            None,
            "decode",
            float(2 * T * M * l.top_k),
            self.io_bytes + float(e * T * M),
            [R(j) for j in range(n)],
        )

    # -- backward ----------------------------------------------------------------------------
    def backward(self) -> None:
        e, T, M, E, n = self.l.elem, self.l.tokens, self.l.model_dim, self.l.experts, self.n
        P = "bwd"
        ring = self.ring
        di_how, m_how = self.di_how, self.m_how
        order = list(reversed(range(n)))  # micro-batches in reverse, as the forward's autograd
        j_of = dict(enumerate(order))

        def ids(step: str):
            return lambda p: self._id(P, step, j_of[p])

        CG, DG, RD = ids("combine_grad"), ids("dispatch_grad"), ids("redispatch")
        HDI, HM, RC = ids("restore_di"), ids("restore_m"), ids("fc1_recompute")
        F2W, F1D, F1W = ids("fc2_wgrad"), ids("fc1_dgrad"), ids("fc1_wgrad")
        ready: dict[str | None, Callable[[int], str]] = {"offload": HDI, "comm": RD}
        di_ready = ready.get(di_how)  # None: T_DI stays resident
        head = self._compute(
            P,
            "decode_grad",
            None,
            "encode",
            0.0,
            float(e * T * M) + self.io_bytes,
            [],
        )
        # copy stream: restore T_M (read first, by fc2's wgrad) then T_DI (fc1's wgrad); the
        # micro-batches the forward left in the ring (the last for T_M, the last two for T_DI)
        # need no restoring
        for p in range(n):
            j = j_of[p]
            if m_how == "offload" and p >= 1:  # the T_M slot: fc2 wgrad of p-1 has read it
                m_bytes = float(self.plan[j].m_bytes[self.rank])
                self._copy("h2d", P, "restore_m", j, m_bytes, [F2W(p - 1)])
            if di_how == "offload" and p >= self.double:  # fc1 wgrad of p-2 has read the slot
                di_bytes = float(self.plan[j].di_bytes[self.rank])
                self._copy("h2d", P, "restore_di", j, di_bytes, [F1W(p - self.double)])
        # compute stream
        for p in range(n):
            j = j_of[p]
            fc1, fc2 = self.plan[j].shapes(self.rank)
            if m_how == "recompute" and p >= 1:
                rdeps = []  # T_DI is resident
                if p >= self.double:  # T_DI is offloaded or re-sent: restored before
                    assert di_ready is not None
                    rdeps = [di_ready(p)]
                self._gemm(P, "fc1_recompute", j, fc1, rdeps)
            d2 = self._gemm(P, "fc2_dgrad", j, _dgrad(fc2), [CG(p)])
            deps = [d2.id]
            if m_how is not None and p >= 1:
                deps.append(HM(p) if m_how == "offload" else RC(p))
            self._gemm(P, "fc2_wgrad", j, _wgrad(fc2), deps)
            deps = [d2.id]
            if ring and p >= self.double:  # dT_DI slot: dispatch gradient of p-2 has sent it
                deps.append(DG(p - self.double))
            d1 = self._gemm(P, "fc1_dgrad", j, _dgrad(fc1), deps)
            deps = [d1.id]
            if di_ready is not None and p >= self.double:
                deps.append(di_ready(p))
            self._gemm(P, "fc1_wgrad", j, _wgrad(fc1), deps)
        # communication stream: alternating, a re-dispatch beside its micro-batch's combine
        # gradient (first when fc1 is recomputed from it, else after)
        for what, p, _ in comm_order(n, ORDER):
            j = j_of[p]
            if what == "second":
                self._comm(P, "dispatch_grad", j, [F1D(p)], reverse=True)
                continue
            deps = [head.id]
            if ring and p >= self.double:  # dT_DO slot: fc2's gradients of p-2 have read it
                deps.append(F2W(p - self.double))
            # gradients travel against their forward exchange: combine's to the experts' ranks
            cg = (P, "combine_grad", j, deps, False)
            rd = None
            if di_how == "comm" and p >= self.double:  # fc1 wgrad of p-2 has read the slot
                rd = (P, "redispatch", j, [F1W(p - self.double)], False)
            if rd is not None and m_how == "recompute":
                self._comm(*rd)
            self._comm(*cg)
            if rd is not None and m_how != "recompute":
                self._comm(*rd)
        enc = self._compute(
            P,
            "encode_grad",
            None,
            "decode",
            0.0,
            self.io_bytes + float(e * T * M),
            [DG(p) for p in range(n)],
        )
        gate_bytes = float(e * (T * M + M * E) + 4 * T * E)
        self._compute(P, "gate_grad", None, "gate", 4.0 * T * M * E, gate_bytes, [enc.id])
