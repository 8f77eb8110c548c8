"""What a PyTorch profiler (Kineto) event is, from its name and arguments: the task kind,
collective kind, sizes, all-to-all splits, process group and sequence number.

Names as torch 2.13 writes them (checked on gloo, see traces/README.md): `c10d::allreduce_`,
`c10d::alltoall_base_` (its "Concrete Inputs" hold the output and input split sizes, in rows)
on the calling thread; `gloo:all_to_all` on gloo's worker threads; on GPUs `ncclDevKernel_*` /
`ncclKernel_*` kernels whose arguments (where the profiler records them, from the CPU-side
`record_param_comms`) name the collective, element counts, dtype, splits, group and sequence.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

# normalised collective name ("alltoall") -> graph kind
COLLECTIVES = {
    "allreduce": "all_reduce",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "send": "send",
    "recv": "recv",
    "sendrecv": "all_to_all",  # NCCL runs all-to-all as grouped send/recv
    "barrier": "all_reduce",
    "reduce": "all_reduce",
    "gather": "all_gather",
    "scatter": "broadcast",
}
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "int": 4,
    "int32": 4,
    "double": 8,
    "float64": 8,
    "long": 8,
    "int64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::half": 2,
    "c10::bfloat16": 2,
    "short": 2,
    "int16": 2,
    "char": 1,
    "int8": 1,
    "byte": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
GEMM = re.compile(
    r"(^|::|_)(mm|bmm|baddbmm|addmm|addbmm|matmul|linear|gemm|sgemm|hgemm)(_|$|\b)|gemm|cutlass|"
    r"cublas|xmma|wgmma|^(Mm|Bmm|Baddbmm|Addmm|Addbmm|Linear)Backward",
    re.IGNORECASE,
)
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",  # the synchronous copy (cudaMemcpyAsync is not a wait)
)


def collective_of(name: str) -> str | None:
    """Normalised collective name of a c10d op, a gloo/nccl annotation or an NCCL kernel."""
    n = name
    if n.startswith("c10d::"):
        n = n[6:]
    elif n.startswith(("gloo:", "nccl:")):
        n = n[5:]
    elif n.lower().startswith(("nccldevkernel_", "ncclkernel_")):
        n = n.split("_", 1)[1].split("_", 1)[0]  # ncclDevKernel_AllReduce_Sum_f32_RING_LL
    else:
        return None
    n = n.strip("_").lower()
    for junk in ("_base", "_into_tensor_coalesced", "_coalesced", "_any_source", "monitored_"):
        n = n.replace(junk, "")
    n = n.replace("_", "")
    return n if n in COLLECTIVES else None


def is_nccl_kernel(name: str) -> bool:
    return name.lower().startswith("nccl")


def compute_kind(name: str) -> str:
    """gemm, softmax, layernorm, attention or elementwise (what the cost model knows)."""
    n = name.rsplit("evaluate_function: ", 1)[-1]
    low = n.lower()
    if GEMM.search(n):
        return "gemm"
    if "softmax" in low:
        return "softmax"
    if "layer_norm" in low or "layernorm" in low or "rmsnorm" in low or "rms_norm" in low:
        return "layernorm"
    if "attention" in low or "flash" in low or "fmha" in low or "sdpa" in low:
        return "attention"
    return "elementwise"


def copy_kind(name: str) -> str:
    n = name.replace(" ", "").lower()
    if "htod" in n or "host->device" in n:
        return "h2d"
    if "dtoh" in n or "device->host" in n or "device->pinned" in n:
        return "d2h"
    return "d2d"


def phase_of(name: str) -> str | None:
    if name.startswith("autograd::engine") or re.search(r"Backward\d*$", name):
        return "bwd"
    if name.startswith("Optimizer."):
        return "opt"
    return None


def dtype_bytes(name: Any) -> int:
    return DTYPE_BYTES.get(str(name).strip().lower(), 4)


def tensor_bytes(args: dict[str, Any], i: int = 0) -> float:
    """Bytes of input `i` from the profiler's record_shapes ("Input Dims", "Input type")."""
    dims = (args.get("Input Dims") or [])[i : i + 1]
    types = (args.get("Input type") or [])[i : i + 1]
    if not dims or not isinstance(dims[0], list) or not all(isinstance(d, int) for d in dims[0]):
        return 0.0
    return float(math.prod(dims[0])) * dtype_bytes(types[0] if types else "float")


def concrete(args: dict[str, Any], i: int) -> Any:
    """Concrete input `i` parsed ('[3, 5]' -> [3, 5], '1' -> 1), None where absent."""
    vals = args.get("Concrete Inputs") or []
    return parse_value(vals[i]) if i < len(vals) else None


def parse_value(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    v = v.strip()
    if not v:
        return None
    try:
        return ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return v


def gemm_shape(name: str, args: dict[str, Any]) -> tuple[dict[str, int] | None, float]:
    """(shape, flops) of an aten GEMM from its input dims, (None, 0) where not readable."""
    dims = args.get("Input Dims") or []
    base = name.split("::")[-1]
    try:
        if base in ("mm", "matmul") and len(dims) >= 2 and len(dims[0]) == len(dims[1]) == 2:
            (m, k), (_, n) = dims[0], dims[1]
            b = 1
        elif base == "addmm" and len(dims) >= 3:
            (m, k), (_, n) = dims[1], dims[2]
            b = 1
        elif base == "bmm" and len(dims) >= 2:
            (b, m, k), (_, _, n) = dims[0], dims[1]
        elif base == "baddbmm" and len(dims) >= 3:
            (b, m, k), (_, _, n) = dims[1], dims[2]
        else:
            return None, 0.0
    except (TypeError, ValueError):
        return None, 0.0
    shape = {"m": int(m), "n": int(n), "k": int(k)} | ({"batch": int(b)} if b != 1 else {})
    return shape, 2.0 * b * m * n * k


def nccl_info(args: dict[str, Any]) -> dict[str, Any]:
    """Collective name, bytes, splits (bytes per member), group and sequence of an NCCL
    kernel, from whichever of the profiler's argument names are present."""

    def get(*keys: str) -> Any:
        for k in keys:
            if k in args:
                return parse_value(args[k])
        return None

    out: dict[str, Any] = {}
    name = get("Collective name", "collective_name")
    if isinstance(name, str):
        out["collective"] = collective_of(f"nccl:{name}")
    size = dtype_bytes(get("dtype", "Dtype") or "float")
    nelems = get("In msg nelems", "in_msg_nelems")
    if isinstance(nelems, (int, float)):
        out["bytes"] = float(nelems) * size
    splits = get("In split size", "in_split_size")
    if isinstance(splits, list) and splits and sum(splits) > 0 and "bytes" in out:
        per_row = out["bytes"] / sum(splits)
        out["split"] = [float(s) * per_row for s in splits]
    ranks = get("Process Group Ranks", "pg_ranks", "Process Group ranks")
    if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
        out["group"] = ranks
    pg = get("Process Group Name", "pg_name", "Process Group Description")
    seq = get("Seq", "seq", "Sequence number")
    if pg is not None and isinstance(seq, int):
        out["key"] = (str(pg), seq)
    return out
