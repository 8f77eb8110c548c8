"""Tasks as real operations: preallocated tensors and a launch function per task.

`OpFactory.build(task)` turns one task of the graph into an `Op` whose `launch()` issues the
work and returns a torch.distributed `Work` for communication (the caller waits on it) or
None for compute and copies. All buffers are allocated here, before the timed run, so that
allocation never shows up in a measured duration.

Sizes follow the graph's conventions (see sim/graph.py and sim/collectives.py):

- gemm with shape {batch, m, n, k, layout}: out[batch, m, n] = A[batch, m, k] @ B[batch, k, n],
  `layout` (sim.hardware.costs.gemm.LAYOUTS; default "nn") saying how each operand is stored:
  "n" as written, "t" transposed (A as [k, m], B as [n, k]) and used through a transposed
  *view*, as autograd does (wgrad x^T dy: "tn"; dgrad dy W^T: "nt"). A materialised transpose
  would give the operand another leading dimension; when that is not a multiple of 8 elements
  cuBLAS leaves the tensor cores (a 5x slower weight gradient on an H100 than training has:
  ../shared/reference/measurements/h100-sxm-2026-11-23, finding 2).
- gate, encode, decode, elementwise, softmax, layernorm, attention, and any compute task
  without a GEMM shape: a memory-bound copy that moves `task.bytes` in total (half read, half
  written), which is what these kernels cost on a GPU to first order.
- d2h / h2d / d2d: a copy of `task.bytes` (pinned host memory on CUDA).
- all_to_all: `bytes` is the whole send buffer, equal splits over the group;
  all_to_allv: `split` / `recv_split` per member (bytes); all_gather: `bytes` is this rank's
  shard; reduce_scatter and all_reduce: `bytes` is the full buffer; broadcast: from group[0];
  send / recv: `bytes` to / from `peer`.

Data types: communication that only moves data uses uint8 so that byte counts are exact;
reductions and GEMMs use the task's dtype (tags["dtype"]). On CPU every compute dtype runs as
float32 (STAND_INS): CPU half-precision matmul is slow or unsupported, and a float32 kernel of
the same shape is the closer stand-in for timing. fp8 runs as bf16 on CUDA (an fp8 GEMM needs
scaling factors that the graph does not describe). tf32 is a float32 GEMM with TF32 tensor
cores allowed, fp32 one with them refused (set per GEMM: the CUDA executor launches from one
thread, so the switch cannot leak into another task).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from exec.errors import ExecError
from exec.runtime.channels import ChannelPlan
from exec.runtime.compat import all_gather_single, reduce_scatter_single, set_tf32_matmul
from sim.core.graph import Task, TaskGraph
from sim.core.kinds import COMPUTE_KINDS, COPY_KINDS
from sim.hardware.costs.gemm import gemm_layout

# The memory-bound stand-in kernel never touches more than this: a what-if graph's huge
# elementwise step is timed on a capped copy rather than exhausting memory (its duration is
# then an underestimate; GEMMs, copies and communication always use their true sizes).
MAX_BUFFER_BYTES = 1 << 30

_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8": torch.bfloat16,
    "fp4": torch.bfloat16,  # no fp4 GEMM in eager torch: run as bf16, as fp8 is
}


# The graph dtype each device really runs a GEMM of a given graph dtype in, where that
# differs (what a calibration measured stands in for the others: sim.hardware.costs.calibration)
STAND_INS = {
    "cpu": {"bf16": "fp32", "fp16": "fp32", "tf32": "fp32", "fp8": "fp32", "fp4": "fp32"},
    "cuda": {"fp8": "bf16", "fp4": "bf16"},
}


def run_dtype(dtype: str, device_type: str) -> str:
    """The graph dtype that a task of `dtype` runs in on this kind of device."""
    return STAND_INS.get(device_type, {}).get(dtype, dtype)


def compute_dtype(task: Task, device: torch.device) -> torch.dtype:
    if device.type == "cpu":
        return torch.float32
    return _DTYPES.get(str(task.tags.get("dtype", "fp32")), torch.float32)


@dataclass
class Op:
    """A prepared task: `launch()` issues it; communication returns the Work to wait on."""

    task: Task
    launch: Callable[[], Any]
    is_comm: bool
    what: str  # for error messages: kind, id, collective, group / peer, stream
    operands: tuple[torch.Tensor, ...] = ()  # a GEMM's (A, B, out) as launched (tests look)

    def __repr__(self) -> str:
        return f"Op({self.what})"


def describe(task: Task) -> str:
    if task.kind in ("send", "recv"):
        way = "to" if task.kind == "send" else "from"
        return (
            f"{task.kind} {task.id!r} ({way} rank {task.peer}, pair {task.coll!r}, "
            f"stream {task.stream})"
        )
    if task.group is not None:
        return (
            f"{task.kind} {task.id!r} (collective {task.coll!r}, peers {task.group}, "
            f"stream {task.stream})"
        )
    return f"{task.kind} {task.id!r} (stream {task.stream})"


class OpFactory:
    """Builds the ops of one rank; buffers are shared between tasks of one stream.

    Tasks of one stream never run at the same time, so they can reuse one another's buffers
    (keyed by stream, role, size and dtype): a graph of many chunks of equal shape needs the
    memory of one chunk per stream, not of all of them.
    """

    def __init__(
        self,
        graph: TaskGraph,
        rank: int,
        device: torch.device,
        plan: ChannelPlan,
        groups: dict,
    ):
        self.graph, self.rank, self.device = graph, rank, device
        self.plan, self.groups = plan, groups
        self._pool: dict[tuple, torch.Tensor] = {}

    # -- buffers --------------------------------------------------------------------------
    def _buf(
        self,
        task: Task,
        role: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        host: bool = False,
    ) -> torch.Tensor:
        key = (task.stream, role, shape, dtype, host)
        t = self._pool.get(key)
        if t is None:
            dev = torch.device("cpu") if host else self.device
            try:
                if dtype.is_floating_point:
                    # small values: no overflow or denormals that would distort timings
                    t = torch.rand(shape, dtype=dtype, device=dev).mul_(0.01)
                else:
                    t = torch.zeros(shape, dtype=dtype, device=dev)
                if host and self.device.type == "cuda":
                    t = t.pin_memory()
            except RuntimeError as e:  # out of memory, typically
                nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                raise ExecError(
                    f"rank {self.rank}: task {task.id!r} needs a {nbytes / 2**20:.1f} MiB "
                    f"{role} buffer on {dev}: {str(e).strip().splitlines()[0]}"
                ) from None
            self._pool[key] = t
        return t

    def _bytes(self, task: Task, role: str, nbytes: float, host: bool = False) -> torch.Tensor:
        return self._buf(task, role, (max(int(round(nbytes)), 0),), torch.uint8, host)

    # -- ops ------------------------------------------------------------------------------
    def build(self, task: Task) -> Op:
        if task.kind in COPY_KINDS:
            launch = self._copy(task)
        elif task.kind in COMPUTE_KINDS:
            s = task.shape or {}
            if {"m", "n", "k"} <= s.keys():
                return self._gemm(task)
            launch = self._compute(task)
        else:
            launch = self._comm(task)
        return Op(task, launch, task.is_comm, describe(task))

    def _gemm(self, task: Task) -> Op:
        s = task.shape or {}
        b, m, n, k = int(s.get("batch", 1)), int(s["m"]), int(s["n"]), int(s["k"])
        try:
            layout = gemm_layout(s)
        except ValueError as e:
            raise ExecError(f"rank {self.rank}: task {task.id!r}: {e}") from None
        dt = compute_dtype(task, self.device)
        # each operand in the memory order its layout names; a "t" operand is the transposed
        # view of its stored buffer (strides swapped, no copy), as autograd passes it to bmm
        if layout[0] == "t":
            a = self._buf(task, "a.t", (b, k, m), dt).transpose(1, 2)
        else:
            a = self._buf(task, "a", (b, m, k), dt)
        if layout[1] == "t":
            w = self._buf(task, "b.t", (b, n, k), dt).transpose(1, 2)
        else:
            w = self._buf(task, "b", (b, k, n), dt)
        out = self._buf(task, "out", (b, m, n), dt)
        launch: Callable[[], Any]
        if self.device.type == "cuda" and dt == torch.float32:
            tf32 = str(task.tags.get("dtype", "fp32")) == "tf32"

            def launch() -> Any:
                set_tf32_matmul(tf32)
                return torch.bmm(a, w, out=out)

        else:

            def launch() -> Any:
                return torch.bmm(a, w, out=out)

        return Op(task, launch, False, describe(task), (a, w, out))

    def _compute(self, task: Task) -> Callable[[], Any]:
        # memory-bound: read bytes/2, write bytes/2, in float32 words
        words = min(int(task.bytes), MAX_BUFFER_BYTES) // 8
        if words == 0:
            return lambda: None
        src = self._buf(task, "src", (words,), torch.float32)
        dst = self._buf(task, "dst", (words,), torch.float32)
        return lambda: dst.copy_(src)

    def _copy(self, task: Task) -> Callable[[], Any]:
        on_cuda = self.device.type == "cuda"
        src_host = task.kind == "h2d"
        dst_host = task.kind == "d2h"
        src = self._bytes(task, "copy_src", task.bytes, host=src_host and on_cuda)
        dst = self._bytes(task, "copy_dst", task.bytes, host=dst_host and on_cuda)
        if src.numel() == 0:
            return lambda: None
        return lambda: dst.copy_(src, non_blocking=on_cuda)

    def _comm(self, task: Task) -> Callable[[], Any]:
        key = self.plan.of_task.get(task.id)
        if key is None or key not in self.groups:
            raise ExecError(f"rank {self.rank}: {describe(task)} has no communicator")
        pg = self.groups[key]
        kind = task.kind
        if kind in ("send", "recv"):
            buf = self._bytes(task, kind, task.bytes)
            tag = self.plan.p2p_tag[task.coll]  # type: ignore[index]
            if kind == "send":
                return lambda: dist.isend(buf, dst=task.peer, group=pg, tag=tag)
            return lambda: dist.irecv(buf, src=task.peer, group=pg, tag=tag)
        group = list(task.group or ())
        n = len(group)
        if kind == "all_to_all":
            per = math.ceil(task.bytes / n)
            inp = self._bytes(task, "a2a_in", per * n)
            out = self._bytes(task, "a2a_out", per * n)
            return lambda: dist.all_to_all_single(out, inp, group=pg, async_op=True)
        if kind == "all_to_allv":
            send = [int(round(v)) for v in task.split or ()]
            recv = self._recv_split(task, group)
            inp = self._bytes(task, "a2av_in", sum(send))
            out = self._bytes(task, "a2av_out", sum(recv))
            return lambda: dist.all_to_all_single(out, inp, recv, send, group=pg, async_op=True)
        if kind == "all_gather":
            inp = self._bytes(task, "ag_in", task.bytes)
            out = self._bytes(task, "ag_out", inp.numel() * n)
            return lambda: all_gather_single(out, inp, group=pg, async_op=True)
        if kind == "broadcast":
            buf = self._bytes(task, "bcast", task.bytes)
            return lambda: dist.broadcast(buf, src=group[0], group=pg, async_op=True)
        # reductions run in a floating dtype: their cost includes the arithmetic
        dt = compute_dtype(task, self.device)
        elem = torch.empty((), dtype=dt).element_size()
        if kind == "all_reduce":
            buf = self._buf(task, "ar", (max(int(task.bytes) // elem, 0),), dt)
            return lambda: dist.all_reduce(buf, group=pg, async_op=True)
        if kind == "reduce_scatter":
            per = math.ceil(task.bytes / elem / n)
            inp = self._buf(task, "rs_in", (per * n,), dt)
            out = self._buf(task, "rs_out", (per,), dt)
            return lambda: reduce_scatter_single(out, inp, group=pg, async_op=True)
        raise ExecError(f"rank {self.rank}: task {task.id!r}: kind {kind!r} is not executable")

    def _recv_split(self, task: Task, group: list[int]) -> list[int]:
        if task.recv_split is not None:
            return [int(round(v)) for v in task.recv_split]
        # Not given: what each member's own task says it sends here.
        me = group.index(self.rank)
        by_rank = {t.rank: t for t in self.plan.peers.get(task.coll, [])}  # type: ignore[arg-type]
        out = []
        for src in group:
            peer = by_rank.get(src)
            out.append(int(round(peer.split[me])) if peer is not None and peer.split else 0)
        return out
