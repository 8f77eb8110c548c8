"""The steps every MoE layer builder shares: the task-id and tag scheme that traces and the
executor key on, compute tasks named by it, the GEMM shapes of the backward, and the check
that experts are whole.
"""

from __future__ import annotations

from sim.core.errors import ConfigError
from sim.core.graph import Task
from sim.workload.moe import MoELayer

PASSES = ("fwd", "bwd")


def task_id(rank: int, lid: int, phase: str, step: str, j: int | None = None) -> str:
    """The id scheme every MoE builder uses (traces and the executor's results key on it):
    r{rank}/L{layer}/{phase}/{step}[.{chunk}]."""
    return f"r{rank}/L{lid}/{phase}/{step}" + ("" if j is None else f".{j}")


def step_tags(lid: int, phase: str, step: str, j: int | None = None) -> dict:
    """The trace tags of a layer step (sim.analysis.trace.TAGS): layer, phase, step, chunk."""
    return {"layer": lid, "phase": phase, "step": step} | ({} if j is None else {"chunk": j})


def compute_task(
    rank: int,
    lid: int,
    phase: str,
    step: str,
    kind: str,
    flops: float,
    nbytes: float,
    deps: list[str],
    j: int | None = None,
    shape: dict | None = None,
) -> Task:
    """A layer step's task on the compute stream, named and tagged by the shared scheme."""
    return Task(
        task_id(rank, lid, phase, step, j),
        rank,
        "compute",
        kind,
        deps=deps,
        flops=flops,
        bytes=nbytes,
        shape=shape,
        tags=step_tags(lid, phase, step, j),
    )


def require_whole_experts(layer: MoELayer, strategy: str) -> None:
    """Builders that place whole experts on GPUs refuse a layer that slices them (E < W;
    sim.workload.slicing builds those)."""
    if layer.experts < layer.world:
        raise ConfigError(
            f"model.experts: {layer.experts} experts on {layer.world} GPUs slice each expert; "
            f"{strategy!r} needs at least one expert per GPU (tutel with parallel p1, p2 or "
            f"auto slices experts)"
        )


class ComputeSteps:
    """`_compute` for rank builders that have `rank`, `lid` and `_add(stream, task)`."""

    rank: int
    lid: int

    def _add(self, stream: str, t: Task) -> str:
        raise NotImplementedError

    def _compute(
        self,
        phase: str,
        step: str,
        kind: str,
        flops: float,
        nbytes: float,
        deps: list[str],
        j: int | None = None,
        shape: dict | None = None,
        allocs: dict | None = None,
        frees: list[str] | None = None,
    ) -> str:
        t = compute_task(self.rank, self.lid, phase, step, kind, flops, nbytes, deps, j, shape)
        t.allocs, t.frees = allocs or {}, frees or []
        return self._add("compute", t)


def dgrad_shape(shape: dict) -> dict:
    """dgrad of y = x W: dx = dy W^T, an (m x n) by (n x k) GEMM: same work as forward; W^T
    is a transposed view of the stored W (layout "nt", sim.hardware.costs.gemm)."""
    b, m, n, k = shape["batch"], shape["m"], shape["n"], shape["k"]
    return {"batch": b, "m": m, "n": k, "k": n, "layout": "nt"}


def wgrad_shape(shape: dict) -> dict:
    """wgrad: dW = x^T dy, a (k x m) by (m x n) GEMM: same work as forward; x^T is a
    transposed view of the stored activation (layout "tn")."""
    b, m, n, k = shape["batch"], shape["m"], shape["n"], shape["k"]
    return {"batch": b, "m": k, "n": n, "k": m, "layout": "tn"}
