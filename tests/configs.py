"""Configurations several test modules share (data only)."""

from __future__ import annotations

# One small pipelined layer on one dgx-a100 node: fast to simulate, valid everywhere.
SMALL = {
    "topology": "dgx-a100",
    "nodes": 1,
    "model": {
        "batch": 1,
        "seq_len": 256,
        "model_dim": 256,
        "hidden_dim": 512,
        "experts_per_gpu": 1,
        "top_k": 1,
    },
    "strategy": {"name": "pipelined", "degree": 2},
}
