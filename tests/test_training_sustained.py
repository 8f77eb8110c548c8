"""`gpu.kernels.sustained`: the share of their short-run rate SM-bound kernels hold in a
training step (the power draw holds the SM clock down): GEMMs, grouped GEMMs and attention
take 1 / sustained as long; memory-bound kernels, on the memory clock, do not change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.hardware.topology import Topology
from sim.training.kernels import GpuKernels
from sim.training.ops import Work

WORKS = [
    Work("fc1", "gemm", 1e13, 1e6, "bf16", shape=(8192.0, 8192.0, 8192.0)),
    Work("experts", "grouped_gemm", 1e13, 1e6, "fp8", experts=8, shape=(2048.0, 4096.0, 7168.0)),
    Work("core_attn", "attention", 1e13, 1e6, bwd=2.5, span=4096.0, head_dim=128),
]


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-b200", "gb200-nvl72"])
def test_sm_bound_kernels_take_one_over_sustained_as_long(preset: str) -> None:
    gpu = GpuKernels.from_gpu(Topology.load(preset, nodes=1).gpu, preset)
    assert 0 < gpu.sustained < 1  # every predict preset names one, with its source
    short = replace(gpu, sustained=1.0)
    for w in WORKS:
        for bwd in (False, True):
            assert gpu.seconds(w, bwd) == pytest.approx(short.seconds(w, bwd) / gpu.sustained)
    mem = Work("norm", "memory", 0.0, 1e9)
    assert (
        gpu.seconds(mem)
        == short.seconds(mem)
        == pytest.approx(1e9 / (gpu.mem_bw * gpu.memory_bound))
    )


def test_a_gpu_without_the_figure_runs_its_short_run_shares() -> None:
    spec = Topology.load("dgx-h100", nodes=1).gpu
    kernels = {k: v for k, v in spec["kernels"].items() if k != "sustained"}
    gpu = GpuKernels.from_gpu({**spec, "kernels": kernels}, "t")
    assert gpu.sustained == 1.0
    assert gpu.rate("bf16") == pytest.approx(spec["peak_flops"]["bf16"] * kernels["gemm"]["bf16"])
