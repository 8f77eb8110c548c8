"""FasterMoE's task graph: per-rank steps of the group-wise exchange, shadowed experts'
broadcast and local compute (see the package doc)."""

from __future__ import annotations

from collections.abc import Callable

from sim.core.graph import Task
from sim.strategies.activations import place
from sim.strategies.fastermoe.layout import StepLayout
from sim.strategies.fastermoe.rule import param_bytes
from sim.strategies.steps import ComputeSteps, dgrad_shape, step_tags, task_id, wgrad_shape
from sim.workload.memory import layer_tensors
from sim.workload.moe import MoELayer

COUNT_BYTES = 8  # one int64 token count per expert in the count all-gather
# The layer's tensors (sim.strategies.activations): a shadowed expert computes this GPU's
# own tokens, from T_I into T_O with no exchange, so its hidden rows are T_M's (and dT_M's)
ROLES = {
    "T_M": (("fc1", "shadow_fc1"), ("fc2", "shadow_fc2")),
    "dT_M": (("fc2_dgrad", "shadow_fc2_dgrad"), ("fc1_wgrad", "shadow_fc1_wgrad")),
}


class _RankBuilder(ComputeSteps):
    def __init__(
        self,
        layer: MoELayer,
        lay: StepLayout,
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
        self.passes = passes
        self.streams: dict[str, list[Task]] = {}
        El = layer.local_experts
        self.active = [
            e for e in range(rank * El, rank * El + El) if e not in set(lay.shadow)
        ]  # my experts whose tokens still come to me

    def place_tensors(self) -> None:
        """The layer's allocs and frees on this rank's tasks, once its passes are built:
        T_DI, T_DO the rows its experts get over the steps, T_M those and the shadowed
        experts' rows."""
        l, M, H = self.l, self.l.model_dim, self.l.hidden_dim
        shapes = [self._shapes(s) for s in range(self.lay.n)]
        rows = sum(self._step_rows(s) for s, sh in enumerate(shapes) if sh is not None)
        hidden = sum(sh[0]["batch"] * sh[0]["m"] for sh in shapes if sh is not None)
        hidden += sum(float(self.lay.tok[self.rank, x]) for x in self.lay.shadow)
        mem = layer_tensors(l.experts * l.capacity, rows, M, H, l.elem)
        mem["T_M"] = mem["dT_M"] = float(hidden * H * l.elem)
        place([t for ts in self.streams.values() for t in ts], mem, self.passes, ROLES)

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
            tags=step_tags(0, phase, step, s),
        )

    def _shapes(self, s: int) -> tuple[dict, dict] | None:
        """fc1 / fc2 shapes of step s, as sim.strategies.chunking sizes them (None: no rows)."""
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

    def _expert_fwd(
        self,
        phase: str,
        pre: str,
        j: int,
        fc1: dict,
        fc2: dict,
        deps: list[str],
        fc2_frees: list[str],
    ) -> str:
        """fc1 then fc2 of an expert (steps `{pre}fc1`, `{pre}fc2`); returns fc2's id."""
        a = self._compute(
            phase,
            f"{pre}fc1",
            "gemm",
            self._flops(fc1),
            self._gemm_bytes(fc1),
            deps,
            j,
            fc1,
        )
        return self._compute(
            phase,
            f"{pre}fc2",
            "gemm",
            self._flops(fc2),
            self._gemm_bytes(fc2),
            [a],
            j,
            fc2,
            frees=fc2_frees,
        )

    def _expert_bwd(
        self,
        phase: str,
        pre: str,
        j: int,
        fc1: dict,
        fc2: dict,
        deps: list[str],
    ) -> tuple[str, str]:
        """dgrad and wgrad of fc2 then fc1 (twice the forward GEMM work); returns the ids of
        fc1's dgrad (the input gradient) and of its wgrad (the last task)."""
        fl1, fl2 = self._flops(fc1), self._flops(fc2)
        b1, b2 = self._gemm_bytes(fc1), self._gemm_bytes(fc2)
        d2 = self._compute(phase, f"{pre}fc2_dgrad", "gemm", fl2, b2, deps, j, dgrad_shape(fc2))
        w2 = self._compute(phase, f"{pre}fc2_wgrad", "gemm", fl2, b2, [d2], j, wgrad_shape(fc2))
        d1 = self._compute(phase, f"{pre}fc1_dgrad", "gemm", fl1, b1, [w2], j, dgrad_shape(fc1))
        w1 = self._compute(phase, f"{pre}fc1_wgrad", "gemm", fl1, b1, [d1], j, wgrad_shape(fc1))
        return d1, w1

    # -- passes ------------------------------------------------------------------------------
    def pass_(self, phase: str) -> None:
        """One pass of the layer on this rank: `forward` or `backward`."""
        if phase == "fwd":
            self.forward()
        else:
            self.backward()

    def _gate_costs(self, fwd: bool) -> tuple[float, float, float]:
        """The gate's FLOPs (its gradient twice the forward's) and bytes, and the bytes of
        the padded [E, C, M] buffer the encode writes and the decode reads."""
        l, e, T, M = self.l, self.l.elem, self.l.tokens, self.l.model_dim
        gate_flops = 2.0 * T * M * l.experts * (1 if fwd else 2)
        gate_bytes = float(e * (T * M + M * l.experts) + 4 * T * l.experts)
        return gate_flops, gate_bytes, float(e * l.experts * l.capacity * M)

    def forward(self) -> None:
        """gate -> encode -> the count all-gather (auto) and shadowed experts' broadcasts ->
        per step: dispatch to group G + s, fc1, fc2, combine back -> shadowed experts on my
        own tokens -> decode."""
        l, e, T, M = self.l, self.l.elem, self.l.tokens, self.l.model_dim
        gate_flops, gate_bytes, buf = self._gate_costs(fwd=True)
        gate = self._compute("fwd", "gate", "gate", gate_flops, gate_bytes, [])
        head = self._compute("fwd", "encode", "encode", 0.0, float(e * T * M) + buf, [gate])
        bcast = self._shadow_broadcasts(self._counts(gate) if self.auto else gate)

        def experts(s: int, fc1: dict, fc2: dict, got: str) -> str:
            return self._expert_fwd("fwd", "", s, fc1, fc2, [got], [])

        first, last_of = self._steps("fwd", "dispatch", head, experts)
        # Shadowed experts on my own tokens, once their parameters are in; after the steps,
        # so a late broadcast never holds up the steps' compute.
        shadow_done = []
        for x in self.lay.shadow:
            shapes = self._shadow_shapes(x)
            if shapes is None:
                continue
            fc1, fc2 = shapes
            frees = [] if self.keep else [f"shadow.{x}"]  # its parameters
            shadow_done.append(
                self._expert_fwd("fwd", "shadow_", x, fc1, fc2, [bcast[x], head], frees)
            )
        tail = self._returns("fwd", "combine", first, last_of) + shadow_done
        self._compute(
            "fwd", "decode", "decode", float(2 * T * M * l.top_k), buf + float(e * T * M), tail
        )
        if not self.keep:
            for x in self.lay.shadow:
                if self._shadow_shapes(x) is None:  # nothing used it: freed right away
                    self.streams["compute"][-1].frees.append(f"shadow.{x}")

    def backward(self) -> None:
        """decode gradient -> shadowed experts' backward and their gradients' all-reduce
        first (it then overlaps the steps) -> per step: combine gradient, fc2 and fc1 dgrad +
        wgrad, dispatch gradient -> encode gradient -> gate gradient."""
        e, T, M = self.l.elem, self.l.tokens, self.l.model_dim
        gate_flops, gate_bytes, buf = self._gate_costs(fwd=False)
        head = self._compute("bwd", "decode_grad", "encode", 0.0, float(e * T * M) + buf, [])
        shadow_done = self._shadow_backward(head)

        def experts(s: int, fc1: dict, fc2: dict, got: str) -> str:
            return self._expert_bwd("bwd", "", s, fc1, fc2, [got])[1]

        first, last_of = self._steps("bwd", "combine_grad", head, experts)
        tail = self._returns("bwd", "dispatch_grad", first, last_of) + shadow_done
        enc = self._compute("bwd", "encode_grad", "decode", 0.0, buf + float(e * T * M), tail)
        self._compute("bwd", "gate_grad", "gate", gate_flops, gate_bytes, [enc])

    def _counts(self, gate: str) -> str:
        """FasterMoE all-gathers the token counts before choosing what to shadow."""
        return self._add(
            "comm",
            Task(
                self._id("fwd", "counts"),
                self.rank,
                "comm",
                "all_gather",
                deps=[gate],
                bytes=float(self.l.experts * COUNT_BYTES),
                group=self.world,
                coll="L0/fwd/counts",
                tags=step_tags(0, "fwd", "counts"),
            ),
        )

    def _shadow_broadcasts(self, ready: str) -> dict[int, str]:
        """Each shadowed expert's parameters broadcast from its owner, once `ready`."""
        l, bcast = self.l, {}
        for x in self.lay.shadow:
            o = x // l.local_experts
            bcast[x] = self._add(
                "comm.1",
                Task(
                    self._id("fwd", "shadow_bcast", x),
                    self.rank,
                    "comm.1",
                    "broadcast",
                    deps=[ready],
                    bytes=param_bytes(l),
                    group=self.rings[o],
                    algo="ring",
                    coll=f"L0/fwd/shadow_bcast.{x}",
                    allocs={f"shadow.{x}": param_bytes(l)},
                    tags=step_tags(0, "fwd", "shadow_bcast") | {"expert": x},
                ),
            )
        return bcast

    def _shadow_backward(self, head: str) -> list[str]:
        """Each shadowed expert's backward on my own tokens, then its parameters' gradient
        all-reduced; the input gradients' ids."""
        done = []
        for x in self.lay.shadow:
            last = head
            shapes = self._shadow_shapes(x)
            if shapes is not None:
                fc1, fc2 = shapes
                d1, last = self._expert_bwd("bwd", "shadow_", x, fc1, fc2, [head])
                done.append(d1)
            self._add(
                "comm.1",
                Task(
                    self._id("bwd", "shadow_reduce", x),
                    self.rank,
                    "comm.1",
                    "all_reduce",
                    deps=[last],
                    bytes=param_bytes(self.l),
                    group=self.world,
                    coll=f"L0/bwd/shadow_reduce.{x}",
                    frees=[f"shadow.{x}"] if self.has_fwd else [],
                    tags=step_tags(0, "bwd", "shadow_reduce") | {"expert": x},
                ),
            )
        return done

    def _steps(
        self,
        phase: str,
        step: str,
        head: str,
        experts: Callable[[int, dict, dict, str], str],
    ) -> tuple[dict[int, Task], dict[int, str]]:
        """Each step's first exchange (`step`, after `head`; created, queued by `_returns`)
        and my experts' work on what it brought (`experts`: the last task's id); by step,
        the exchanges and the last task of each (the exchange itself where no rows came)."""
        first: dict[int, Task] = {}
        for what, s, stream in self.seq:
            if what == "first":
                first[s] = self._exchange(phase, step, s, stream, [head], back=False)
        last_of: dict[int, str] = {}
        for s in range(self.lay.n):
            shapes = self._shapes(s)
            last_of[s] = first[s].id if shapes is None else experts(s, *shapes, first[s].id)
        return first, last_of

    def _returns(
        self, phase: str, step: str, first: dict[int, Task], last_of: dict[int, str]
    ) -> list[str]:
        """Each step's second exchange (`step`, back to the tokens' ranks), then every
        exchange queued in issue order: created first, since the second exchange of a step
        depends on compute tasks that must exist by id first. The second exchanges' ids."""
        second: dict[int, Task] = {}
        for what, s, stream in self.seq:
            if what == "second":
                second[s] = self._exchange(phase, step, s, stream, [last_of[s]], back=True)
        for what, s, stream in self.seq:
            self._add(stream, first[s] if what == "first" else second[s])
        return [second[s].id for s in range(self.lay.n)]
