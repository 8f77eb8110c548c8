"""The vocabulary of a task graph: the kinds of streams and of tasks, its data types, GEMM
layouts and shape fields, and its file format's version; and the kinds of a node's devices.

Kept apart from the graph itself so that the load-time checks, the engine and the executor can
name kinds without importing the graph (and without an import cycle between graph and checks),
and the input schemas without importing the graph's (`sim.core.graph_schema`: TypedDicts a run
from a config never validates, a hundredth of its start-up).
"""

from __future__ import annotations

SCHEMA_VERSION = 1  # of a task graph's JSON file
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")  # == sim.hardware.costs.compute.DTYPE_BYTES
# how a GEMM's operands are stored: A then B, "n" as written, "t" a transposed view
GEMM_LAYOUTS = ("nn", "nt", "tn", "tt")
# what a GEMM shape's fields mean, shared by the graph's, the calibration's and the config's
# shape rows
GEMM_DIMS = {
    "m": "m: rows of A and of the output (out[m, n] = A[m, k] @ B[k, n])",
    "n": "n: columns of B and of the output",
    "k": "k: the dimension reduced over",
    "batch": "independent GEMMs of this shape in one kernel (grouped experts); work = batch x "
    "m x n x k; default 1",
    "layout": "how A then B are stored: n as written (A [m, k], B [k, n]), t a transposed "
    "view (A [k, m], B [n, k]); default nn",
}

# what a device of a node that is not a GPU can be (a topology's `node.devices`)
DEVICE_TYPES = ("nvswitch", "pcie_switch", "host", "nic")

# Stream kinds; a stream name is a kind optionally followed by ".<n>" (e.g. "comm.1").
STREAM_KINDS = ("compute", "comm", "copy")

COMPUTE_KINDS = frozenset(
    {"gemm", "elementwise", "gate", "encode", "decode", "softmax", "layernorm", "attention"}
)
COPY_KINDS = frozenset({"d2h", "h2d", "d2d"})
COLLECTIVE_KINDS = frozenset(
    {"all_to_all", "all_to_allv", "all_gather", "reduce_scatter", "all_reduce", "broadcast"}
)
P2P_KINDS = frozenset({"send", "recv"})
COMM_KINDS = COLLECTIVE_KINDS | P2P_KINDS
ALL_KINDS = COMPUTE_KINDS | COPY_KINDS | COMM_KINDS


def stream_kind(stream: str) -> str:
    return stream.split(".", 1)[0]
