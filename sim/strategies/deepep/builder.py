"""The task graph of a layer on DeepEP's normal kernels (see the package docstring)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from sim.core.errors import ConfigError
from sim.core.graph import Task, TaskGraph
from sim.strategies.activations import place
from sim.strategies.deepep.volumes import Volumes, row_bytes, volumes
from sim.strategies.steps import (
    PASSES,
    compute_task,
    dgrad_shape,
    require_whole_experts,
    step_tags,
    task_id,
    wgrad_shape,
)
from sim.workload.memory import layer_tensors
from sim.workload.moe import MoELayer

COUNT_BYTES = 4  # DeepEP's counts are int32
# The layer's tensors (sim.strategies.activations) where DeepEP's steps differ: the dispatch
# reads the layer's input x as it is (no encode), the backward starts at the combine's
# gradient (no decode) and ends at the gate's (no encode)
ROLES = {
    "T_I": (("gate",), ("dispatch",)),
    "dT_O": (("combine_grad",), ("combine_grad",)),
    "dT_I": (("dispatch_grad",), ("gate_grad",)),
}


def build_deepep(
    layer: MoELayer,
    passes: tuple[str, ...],
    gpus_per_node: int,
    max_nodes: int | None,
    dispatch_dtype: str,
    sms: int,
    strategy: str,
    dedup: str = "expected",
) -> TaskGraph:
    require_whole_experts(layer, strategy)
    for p in passes:
        if p not in PASSES:
            raise ConfigError(f"passes: expected entries from {PASSES}, got {p!r}")
    vol = volumes(layer, gpus_per_node, max_nodes, dedup)
    disp_row = row_bytes(layer.model_dim, dispatch_dtype)
    bf16_row = row_bytes(layer.model_dim, "bf16")
    meta_layer = {f.name: getattr(layer, f.name) for f in fields(layer) if f.name != "routing"}
    g = TaskGraph(
        layer.world,
        meta={
            "strategy": strategy,
            "passes": list(passes),
            "gpus_per_node": vol.gpus_per_node,
            "max_nodes": max_nodes,
            "dispatch_dtype": dispatch_dtype,
            "sms": sms,
            "layer": meta_layer | {"routing": layer.routing.get("kind")},
            "tokens_per_node": float(vol.node_tokens.sum(axis=1).mean() / layer.tokens),
        },
    )
    group = list(range(layer.world))
    for rank in range(layer.world):
        tasks = _RankTasks(layer, vol, rank, group, sms).passes(passes, disp_row, bf16_row)
        # T_I and T_O: the rank's T tokens; T_DI: one row per (token, GPU), in the dispatch
        # dtype; T_M, T_DO: one row per (token, expert)
        recv = float(vol.gpu_tokens[:, rank].sum())
        mem = layer_tensors(
            layer.tokens,
            float(vol.expert_rows[rank]),
            layer.model_dim,
            layer.hidden_dim,
            layer.elem,
            received_rows=recv,
            dispatch_row=disp_row,
        )
        place(tasks, mem, passes, ROLES)
        for t in tasks:
            g.add(t)
    g.validate()
    return g


class _RankTasks:
    def __init__(self, layer: MoELayer, vol: Volumes, rank: int, group: list[int], sms: int):
        self.l, self.v, self.rank, self.group, self.sms = layer, vol, rank, group, sms
        self.out: list[Task] = []

    def _add(self, t: Task) -> str:
        t.tags.setdefault("dtype", self.l.dtype)
        self.out.append(t)
        return t.id

    def _compute(self, phase, step, kind, flops, nbytes, deps, shape=None) -> str:
        t = compute_task(self.rank, 0, phase, step, kind, flops, nbytes, deps, None, shape)
        return self._add(t)

    def _exchange(self, phase: str, step: str, deps: list[str], row: float, combine: bool) -> str:
        """Dispatch-direction (owner -> expert GPUs) or combine-direction exchange."""
        D = self.v.gpu_tokens * row  # [owner, expert GPU] bytes
        p = self.rank
        send, recv = (D[:, p], D[p]) if combine else (D[p], D[:, p])
        tags = step_tags(0, phase, step) | {
            "deepep": "combine" if combine else "dispatch",
            "node_bytes": (self.v.node_tokens[p] * row).tolist(),
        }
        return self._add(
            Task(
                task_id(p, 0, phase, step),
                p,
                "comm",
                "all_to_allv",
                deps=deps,
                bytes=float(send.sum()),
                split=send.tolist(),
                recv_split=recv.tolist(),
                group=self.group,
                coll=f"L0/{phase}/{step}",
                algo="deepep",
                tags=tags,
                sms=self.sms,
            )
        )

    def _shapes(self) -> tuple[dict, dict]:
        rows, M, H = int(round(self.v.expert_rows[self.rank])), self.l.model_dim, self.l.hidden_dim
        return ({"batch": 1, "m": rows, "n": H, "k": M}, {"batch": 1, "m": rows, "n": M, "k": H})

    def passes(self, passes: tuple[str, ...], disp_row: float, bf16_row: float) -> list[Task]:
        """This rank's tasks of the passes asked for (`forward`, `backward`); `disp_row` and
        `bf16_row` are the bytes of a dispatched token row and of a BF16 one."""
        if "fwd" in passes:
            self.forward(disp_row, bf16_row)
        if "bwd" in passes:
            self.backward(bf16_row)
        return self.out

    def _gemms(self) -> tuple[dict, dict, float, float, float, float]:
        """The experts' fc1 and fc2 shapes on this rank, their FLOPs and their bytes."""
        e = self.l.elem
        fc1, fc2 = self._shapes()
        f1, f2 = (2.0 * s["m"] * s["n"] * s["k"] for s in (fc1, fc2))
        b1, b2 = (
            float(e * (s["m"] * s["k"] + s["m"] * s["n"] + s["k"] * s["n"])) for s in (fc1, fc2)
        )
        return fc1, fc2, f1, f2, b1, b2

    def _gate_bytes(self) -> float:
        l, T, M = self.l, self.l.tokens, self.l.model_dim
        return float(l.elem * (T * M + M * l.experts) + 4 * T * l.experts)

    def forward(self, disp_row: float, bf16_row: float) -> None:
        """gate -> layout -> notify (the counts) and the host's wait on them -> dispatch ->
        fc1, fc2 -> combine -> decode."""
        l, e, T, M, E = self.l, self.l.elem, self.l.tokens, self.l.model_dim, self.l.experts
        fc1, fc2, f1, f2, b1, b2 = self._gemms()
        recv_rows = float(self.v.gpu_tokens[:, self.rank].sum())
        gate = self._compute("fwd", "gate", "gate", 2.0 * T * M * E, self._gate_bytes(), [])
        # layout kernel: per-token rank / node masks from the top-k indices
        lay = self._compute(
            "fwd", "layout", "elementwise", 0.0, float(4 * T * (l.top_k + l.world)), [gate]
        )
        notify = self._add(
            Task(
                task_id(self.rank, 0, "fwd", "notify"),
                self.rank,
                "comm",
                "all_to_all",
                deps=[lay],
                bytes=float(COUNT_BYTES * l.world * (1 + l.local_experts)),
                group=self.group,
                coll="L0/fwd/notify",
                tags=step_tags(0, "fwd", "notify"),
            )
        )
        # the host waits on the received counts (mapped memory) to size the buffers
        wait = self._add(
            Task(
                task_id(self.rank, 0, "fwd", "notify_wait"),
                self.rank,
                "copy",
                "d2h",
                deps=[notify],
                bytes=float(COUNT_BYTES * (1 + l.local_experts)),
                host_sync=True,
                tags=step_tags(0, "fwd", "notify_wait"),
            )
        )
        got = self._exchange("fwd", "dispatch", [wait], disp_row, combine=False)
        a = self._compute("fwd", "fc1", "gemm", f1, b1, [got], fc1)
        b = self._compute("fwd", "fc2", "gemm", f2, b2, [a], fc2)
        back = self._exchange("fwd", "combine", [b], bf16_row, combine=True)
        self._compute(
            "fwd",
            "decode",
            "decode",
            float(2 * T * M * l.top_k),
            float(e * (recv_rows + T) * M),
            [back],
        )

    def backward(self, bf16_row: float) -> None:
        """combine gradient -> fc2 and fc1 dgrad + wgrad -> dispatch gradient -> gate
        gradient (every gradient row BF16)."""
        T, M, E = self.l.tokens, self.l.model_dim, self.l.experts
        fc1, fc2, f1, f2, b1, b2 = self._gemms()
        got = self._exchange("bwd", "combine_grad", [], bf16_row, combine=False)
        d2 = self._compute("bwd", "fc2_dgrad", "gemm", f2, b2, [got], dgrad_shape(fc2))
        w2 = self._compute("bwd", "fc2_wgrad", "gemm", f2, b2, [d2], wgrad_shape(fc2))
        d1 = self._compute("bwd", "fc1_dgrad", "gemm", f1, b1, [w2], dgrad_shape(fc1))
        w1 = self._compute("bwd", "fc1_wgrad", "gemm", f1, b1, [d1], wgrad_shape(fc1))
        back = self._exchange("bwd", "dispatch_grad", [w1], bf16_row, combine=True)
        self._compute("bwd", "gate_grad", "gate", 4.0 * T * M * E, self._gate_bytes(), [back])


def dispatch_tokens(vol: Volumes) -> np.ndarray:
    """[P] (token, node) pairs each owner sends, its own node included (what DeepEP's tests
    count as RDMA tokens)."""
    return vol.node_tokens.sum(axis=1)
