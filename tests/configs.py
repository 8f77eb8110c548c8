"""Configurations and stubs several test modules share."""

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


def switch_ports(n: int, port: dict) -> dict:
    """The topology spec of n GPUs, one port each (link class `port`) on one switch: with
    small messages, the port's per-message costs alone decide a collective's time."""
    return {
        "name": "ports",
        "nodes": n,
        "gpus_per_node": 1,
        "gpu": {"peak_flops": {"bf16": 1e14}, "mem_bw": 1e12, "memory_bytes": 80e9},
        "node": {"devices": {}, "links": [], "nic_of_gpu": ["gpu0"]},
        "fabric": {"type": "switch", "class": "port", "attach": ["gpu0"]},
        "link_classes": {"port": port},
    }


class NoComm:
    """A step model's collective timer whose collectives are free (memory and compute-only
    tests of `sim.training.step.StepModel`)."""

    simulations = 0

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return 0.0

    def place(self, rank: int) -> int:
        return rank
