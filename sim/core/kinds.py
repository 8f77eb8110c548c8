"""The vocabulary of a task graph: the kinds of streams and of tasks.

Kept apart from the graph itself so that the load-time checks, the engine and the executor can
name kinds without importing the graph (and without an import cycle between graph and checks).
"""

from __future__ import annotations

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
