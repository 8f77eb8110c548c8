"""The presets' training figures: precisions (fp8, fp4), the dgx-b200 box and `gpu.kernels`."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import yaml

from sim.core.errors import TopologyError
from sim.core.graph_schema import DTYPES
from sim.hardware.costs.gemm import DTYPE_BYTES
from sim.hardware.topology import Topology
from sim.hardware.topology.schema import KernelParams
from sim.hardware.topology.spec import list_presets, topologies_dir

PRESETS = list_presets()
HOPPER = ("dgx-h100", "dgx-h100-superpod", "h800", "hgx-h200")
BLACKWELL = ("dgx-b200", "gb200-nvl72")


@cache
def _raw(name: str) -> dict:
    return yaml.safe_load((topologies_dir() / f"{name}.yaml").read_text())


def _spec(name: str) -> dict:
    return copy.deepcopy(_raw(name))


def test_fp4_is_a_dtype_of_half_a_byte():
    assert "fp4" in DTYPES and DTYPE_BYTES["fp4"] == 0.5
    assert set(DTYPES) == set(DTYPE_BYTES)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_with_the_new_fields(name):
    topo = Topology.load(name, nodes=1)
    kernels = topo.gpu.get("kernels")
    if name in HOPPER + BLACKWELL:
        assert kernels is not None, f"{name} has no gpu.kernels"
        assert set(kernels) == set(KernelParams.model_fields)
        for dt, share in kernels["gemm"].items():
            assert dt in topo.gpu["peak_flops"] and 0 < share <= 1


@pytest.mark.parametrize("name", HOPPER + BLACKWELL)
def test_fp8_and_fp4_peaks(name):
    peak = _raw(name)["gpu"]["peak_flops"]
    # the datasheets round: 1,979 vs 2 x 989
    assert peak["fp8"] == pytest.approx(2 * peak["bf16"], rel=1e-3)
    if name in BLACKWELL:
        assert peak["fp4"] == pytest.approx(2 * peak["fp8"])
    else:
        assert "fp4" not in peak  # Hopper has no FP4 tensor cores


@pytest.mark.parametrize("name", PRESETS)
def test_peaks_ordered_fp4_fp8_bf16_where_present(name):
    peak = _raw(name)["gpu"]["peak_flops"]
    order = [peak[d] for d in ("fp4", "fp8", "bf16") if d in peak]
    assert order == sorted(order, reverse=True) and len(set(order)) == len(order)


def test_dgx_b200_is_8_gpus_on_nvlink5():
    topo = Topology.load("dgx-b200")
    assert topo.gpus_per_node == 8 and topo.world_size == 16
    nvlink = topo.link_classes["nvlink5"]
    assert nvlink.bw == 900e9
    # every GPU pair of a node meets on the NVLink switch, one hop each way
    route = topo.route(0, 7)
    assert [topo.link_name(lk) for lk in route] == ["n0/gpu0->n0/nvswitch", "n0/nvswitch->n0/gpu7"]
    # across nodes through the GPU's own NIC
    assert "n0/nic3" in {topo.link_name(lk).split("->")[1] for lk in topo.route(3, 11)}
    gpu = topo.gpu
    assert gpu["memory_bytes"] == 180e9 and gpu["sms"] == 148
    assert (gpu["peak_flops"]["bf16"], gpu["peak_flops"]["fp8"], gpu["peak_flops"]["fp4"]) == (
        2.25e15,
        4.5e15,
        9e15,
    )


def test_gb200_rack_is_72_gpus_with_a_nic_each():
    topo = Topology.load("gb200-nvl72")
    assert topo.gpus_per_node == 72 and len(topo.nics) == 72
    assert topo.link_classes["nvlink5"].bw == 900e9
    assert topo.gpu["peak_flops"]["fp4"] == 10e15


def _refusal(mutate) -> str:
    s = _spec("dgx-h100")
    mutate(s["gpu"]["kernels"])
    with pytest.raises(TopologyError) as e:
        Topology(s)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_schema_refuses_a_share_above_one():
    msg = _refusal(lambda k: k.update(attention_fwd=1.5))
    assert "gpu.kernels.attention_fwd" in msg and "1.5" in msg


def test_schema_refuses_an_unknown_key():
    msg = _refusal(lambda k: k.update(attention_fwd_share=0.5))
    assert "gpu.kernels.attention_fwd_share" in msg


def test_schema_refuses_an_unknown_dtype_and_a_negative_launch():
    assert "gpu.kernels.gemm.int4" in _refusal(lambda k: k["gemm"].update(int4=0.5))
    assert "gpu.kernels.launch_s" in _refusal(lambda k: k.update(launch_s=-1e-6))


def test_kernels_are_optional_field_by_field():
    s = _spec("dgx-h100")
    s["gpu"]["kernels"] = {"attention_fwd": 0.6}
    assert Topology(s).gpu["kernels"] == {"attention_fwd": 0.6}
    s["gpu"].pop("kernels")
    Topology(s)


def test_kernels_do_not_change_a_simulation():
    """gpu.kernels is documentation for now: dropping it leaves every cost as it was."""
    from sim.core.graph import Task
    from sim.hardware.costs import CostModel

    s = _spec("dgx-h100")
    with_k = CostModel.build(Topology(s, nodes=1), {}).compute
    s["gpu"].pop("kernels")
    without = CostModel.build(Topology(s, nodes=1), {}).compute
    tasks = [
        Task("g", 0, "compute", "gemm", flops=2e12, bytes=3e8, tags={"dtype": "bf16"}),
        Task("e", 0, "compute", "elementwise", flops=0.0, bytes=4e8, tags={"dtype": "bf16"}),
    ]
    for t in tasks:
        assert with_k.duration(t) == without.duration(t)
