"""The topology file's schema: every field a preset in topologies/ uses, its type and range.

Checked on load, before the node template is wired (`sim.hardware.topology`): a link of
`bw: .inf` or `1e-300` B/s, a NaN latency, `memory_bytes: 0`, a misspelled key or a device of
an unknown type is refused with its path. What needs more than one field (a link naming a
device the node does not have, a fabric class that is no link class, a NIC per GPU) is checked
where the topology is built. `moesim schema topology` prints the JSON Schema.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.core.graph_schema import DTYPES
from sim.core.schema import Fraction, PosInt, Strict
from sim.hardware.costs_schema import (
    Collectives,
    ComputeFits,
    DispatchParams,
    GemmModelParams,
    Interference,
    ResourceParams,
    RooflineParams,
    Seconds,
)

DEVICE_TYPES = ("nvswitch", "pcie_switch", "host", "nic")
FABRIC_TYPES = ("switch", "fat_tree", "rail")
MIN_BW, MAX_BW = 1e3, 1e15  # bytes/s per direction: from a 1 KB/s test link to 1 PB/s
MAX_GPUS_PER_NODE = 4096

Name = Annotated[str, Field(min_length=1, max_length=256)]
Bandwidth = Annotated[float, Field(ge=MIN_BW, le=MAX_BW, allow_inf_nan=False)]
Dtype = Literal[DTYPES]  # type: ignore[valid-type]


class LinkClassSpec(Strict):
    bw: Bandwidth  # line rate per direction
    latency: Seconds = 0.0
    efficiency: Fraction = 1.0  # share of the line rate a large transfer achieves
    msg_cost: Seconds = 0.0  # time a message occupies the link before its payload
    source: str | None = None


class GpuSpec(Strict):
    model: str | None = None
    memory_bytes: Annotated[float, Field(gt=0, le=2.0**60, allow_inf_nan=False)]  # per GPU
    mem_bw: Bandwidth
    peak_flops: Annotated[
        dict[Dtype, Annotated[float, Field(gt=0, le=1e21, allow_inf_nan=False)]],
        Field(min_length=1),
    ]
    roofline: RooflineParams | None = None
    alpha_beta: ComputeFits | None = None
    interference: Interference | None = None
    dispatch: DispatchParams | None = None
    gemm: GemmModelParams | None = None
    sms: Annotated[int, Field(gt=0, le=100_000)] | None = None  # streaming multiprocessors
    resources: ResourceParams | None = None  # SM / HBM sharing and hardware queues


class LinkEntry(Strict):
    """Links of the node template: a list on both sides pairs element-wise; a single name
    on one side fans out to every name of the other."""

    a: Name | Annotated[list[Name], Field(min_length=1)]
    b: Name | Annotated[list[Name], Field(min_length=1)]
    class_: Name = Field(alias="class")

    @model_validator(mode="after")
    def _same_length(self) -> LinkEntry:
        if isinstance(self.a, list) and isinstance(self.b, list) and len(self.a) != len(self.b):
            raise ValueError(f"lists a ({len(self.a)}) and b ({len(self.b)}) differ in length")
        return self


class NodeSpec(Strict):
    devices: dict[Name, Literal[DEVICE_TYPES]] | None = None  # type: ignore[valid-type]
    links: list[LinkEntry] | None = None
    nic_of_gpu: Annotated[list[Name], Field(min_length=1)] | None = None


class FabricSpec(Strict):
    """The network between nodes (`sim.hardware.fabric`); also the run config's `fabric:`
    overrides, merged over a topology's before this check."""

    type: Literal[FABRIC_TYPES]  # type: ignore[valid-type]
    class_: Name = Field(alias="class")
    attach: Annotated[list[Name], Field(min_length=1)] | None = None
    nodes_per_leaf: Annotated[int, Field(gt=0, le=10**6)] | None = None
    nodes_per_unit: Annotated[int, Field(gt=0, le=10**6)] | None = None
    oversubscription: Annotated[float, Field(gt=0, le=1e3, allow_inf_nan=False)] | None = None
    planes: Literal["single", "multi"] | None = None

    @model_validator(mode="after")
    def _fields_of_type(self) -> FabricSpec:
        applies = {
            "nodes_per_leaf": ("fat_tree",),
            "nodes_per_unit": ("rail",),
            "oversubscription": ("fat_tree", "rail"),
            "planes": ("rail",),
        }
        for key, types in applies.items():
            value = getattr(self, key)
            if value is None or self.type in types:
                continue
            if key == "oversubscription" and value == 1 or key == "planes" and value == "single":
                continue  # the neutral value says nothing wrong
            raise ValueError(
                f"{key} does not apply to a {self.type!r} fabric (only to {' and '.join(types)})"
            )
        return self


class NetworkSpec(Strict):
    alpha: Seconds = 0.0  # start-up per message in flow mode


class TopologySpec(Strict):
    name: Name
    description: str | None = None
    nodes: PosInt = 1  # default node count; a run's `nodes` overrides it
    gpus_per_node: Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE)]
    gpu: GpuSpec
    node: NodeSpec
    fabric: FabricSpec | None = None
    link_classes: Annotated[dict[Name, LinkClassSpec], Field(min_length=1)]
    network: NetworkSpec | None = None
    collectives: Collectives | None = None
