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

# One tiny forward layer on two flat-switch nodes: the cheapest run that has a network.
TINY_FLAT = {
    "topology": "flat-switch",
    "nodes": 2,
    "model": {
        "batch": 1,
        "seq_len": 128,
        "model_dim": 128,
        "hidden_dim": 256,
        "experts_per_gpu": 1,
        "top_k": 1,
    },
    "strategy": "sequential",
    "passes": ["fwd"],
}
