"""The topology file's schema: every field a preset in topologies/ uses, its type and range.

Checked on load, before the node template is wired (`sim.hardware.topology`): a link of
`bw: .inf` or `1e-300` B/s, a NaN latency, `memory_bytes: 0`, a misspelled key or a device of
an unknown type is refused with its path. What needs more than one field (a link naming a
device the node does not have, a fabric class that is no link class, a NIC per GPU) is checked
where the topology is built. `moesim schema topology` prints the JSON Schema.
"""

# Annotations evaluated as the classes are made (no `from __future__ import annotations`):
# as strings, pydantic would compile and evaluate each field's at start-up (~1% of a small
# `moesim simulate`). A method returning its own class names it in quotes.

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.core.kinds import DEVICE_TYPES, DTYPES
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
    SharedCpu,
)

FABRIC_TYPES = ("switch", "fat_tree", "rail")
MIN_BW, MAX_BW = 1e3, 1e15  # bytes/s per direction: from a 1 KB/s test link to 1 PB/s
MAX_GPUS_PER_NODE = 4096

Name = Annotated[str, Field(min_length=1, max_length=256)]
Bandwidth = Annotated[float, Field(ge=MIN_BW, le=MAX_BW, allow_inf_nan=False)]
Dtype = Literal[DTYPES]  # type: ignore[valid-type]


class LinkClassSpec(Strict):
    bw: Bandwidth = Field(description="line rate per direction, bytes/s")
    latency: Seconds = Field(
        0.0,
        description="seconds before data moves across a link; a route's latency is the sum "
        "over its links",
    )
    efficiency: Fraction = Field(
        1.0, description="share of the line rate a large transfer achieves, in (0, 1]"
    )
    msg_cost: Seconds = Field(
        0.0,
        description="seconds a message occupies the link before its payload (the message "
        "rate of a NIC)",
    )
    conn_cost: Seconds = Field(
        0.0,
        description="seconds each message's occupancy grows per message crossing the same "
        "link in the same collective step (a cost per concurrent peer connection: NCCL's "
        "per-peer proxy work and the NIC's connection state); 0: none",
    )
    conn_inflight: Annotated[int, Field(ge=0, le=10**9)] = Field(
        0,
        description="messages through one such link whose connections are served at once "
        "(NCCL's point-to-point peers in flight per GPU, times the GPUs sending through the "
        "link): a step with more messages runs them in rounds of this many, so the "
        "connection term stops growing there (each message pays conn_cost * min(messages, "
        "conn_inflight)); 0: no bound",
    )
    source: str | None = Field(
        None, description="where the figures come from: documentation, the simulator ignores it"
    )


Factor = Annotated[float, Field(gt=0, le=4, allow_inf_nan=False)]
Tokens = Annotated[float, Field(gt=0, le=2.0**30, allow_inf_nan=False)]


class AttentionPass(Strict):
    fwd: Factor = Field(description="the forward kernel's factor")
    bwd: Factor = Field(description="the backward kernel's factor")


class AttentionLen0(Strict):
    fwd: Tokens = Field(description="the forward kernel's len0, tokens")
    bwd: Tokens = Field(description="the backward kernel's len0, tokens")


class AttentionShape(Strict):
    """How the attention kernels' share of peak moves with the kernel's shape (`gpu.kernels.
    attention_shape`): share(L, d) = attention_fwd|bwd x head_dim[d] / (1 + len0 / L) x (1 +
    len0 / ref_len), L the causal-equivalent sequence the kernel loops over."""

    len0: AttentionLen0 = Field(
        description="tokens: the causal sequence length at which a pass reaches half its "
        "long-sequence share (its per-tile fixed work against the key loop)"
    )
    head_dim: dict[PosInt, AttentionPass] = Field(
        min_length=1,
        description="query/key head dim -> the share relative to head dim 128 (linear between "
        "the dims given, the nearest beyond them)",
    )
    ref_len: Tokens = Field(
        6144.0,
        description="the sequence length at which attention_fwd / attention_bwd hold (the "
        "middle of the 4K-8K their sources measured)",
    )


class KernelParams(Strict):
    """What a training step's kernels reach on this GPU, as shares of the datasheet peaks
    (`gpu.kernels`). Each field is optional: None (omitted) means unknown, and a cost model
    that needs it falls back to its own defaults. Documentation of measured or published
    figures (each with its source in the preset's comment), not fitted to step times, but for
    `launch_s`: no measurement of it inside a training step is public, and the DGX / HGX
    presets carry one fitted to published step times (benchmarks/results/host_fit.md)."""

    gemm: dict[Dtype, Fraction] | None = Field(
        None,
        description="dtype -> share of that dtype's dense peak (peak_flops) that large "
        "training GEMMs reach in practice with cuBLAS / Transformer Engine (8192^3 and the "
        "Llama / DeepSeek projection and FFN shapes, thousands of tokens), in (0, 1]; fp8 "
        "covers FP8 and MXFP8, fp4 NVFP4",
    )
    gemm_k0: dict[Dtype, Tokens] | None = Field(
        None,
        description="dtype -> the reduction length K at which a GEMM reaches half its long-K "
        "share: share(K) = gemm[dtype] x (1 + k0 / 8192) / (1 + k0 / K), each output tile's "
        "fixed work against its K loop (the gemm shares hold at 8192^3); omitted: one share "
        "whatever K",
    )
    grouped_gemm: Fraction | None = Field(
        None,
        description="share of the large-GEMM rate (gemm[dtype] x peak) that a grouped expert "
        "GEMM reaches (Transformer Engine / CUTLASS grouped GEMM, a few thousand tokens per "
        "expert, k and n of 1-8K), in (0, 1]",
    )
    sustained: Fraction | None = Field(
        None,
        description="share of the gemm and attention shares (short-run benchmark figures, "
        "a cold GPU at its boost clock) that these SM-bound kernels hold under a training "
        "step's sustained power draw, which holds the SM clock down (the memory clock holds, "
        "so memory-bound kernels keep memory_bound), in (0, 1]; omitted: 1",
    )
    attention_fwd: Fraction | None = Field(
        None,
        description="share of the bf16 dense peak that the training attention forward kernel "
        "reaches (FlashAttention-3 / cuDNN on Hopper, cuDNN / FlashAttention-4 on Blackwell), "
        "causal, head dim 128, sequence 4K-8K, in (0, 1]. FLOPs as FlashAttention's benchmarks "
        "count them: 4 * L^2 * d per head for the full product (two GEMMs), halved for causal, "
        "so a causal forward's FLOPs are 2 * L^2 * d per head",
    )
    attention_bwd: Fraction | None = Field(
        None,
        description="share of the bf16 dense peak that the training attention backward kernel "
        "reaches, same kernels and shapes as attention_fwd, in (0, 1]. FLOPs as FlashAttention "
        "counts them: 2.5x the forward's (five GEMMs to the forward's two), causal halved, so "
        "5 * L^2 * d per head for a causal backward",
    )
    attention_shape: AttentionShape | None = Field(
        None,
        description="the attention shares' dependence on sequence length and head dim; "
        "omitted: one share whatever the shape",
    )
    memory_bound: Fraction | None = Field(
        None,
        description="share of mem_bw that fused elementwise, normalisation and cast kernels "
        "reach (bytes read plus written over the kernel time), in (0, 1]",
    )
    launch_s: Seconds | None = Field(
        None,
        description="per-kernel overhead in a training step run without CUDA graphs: the host "
        "launch gap between consecutive kernels (framework dispatch + launch), seconds",
    )
    kernel_s: Seconds | None = Field(
        None,
        description="per-kernel time on the GPU itself, with or without CUDA graphs: an empty "
        "kernel's run plus the dispatch gap to the next kernel in the stream, seconds",
    )
    hybridep_link_share: Fraction | None = Field(
        None,
        description="share of its links' rate (as the preset's link classes carry an "
        "all-to-all) that NVIDIA's HybridEP dispatch and combine reach, one row per (token, "
        "GPU) as DeepEP's kernels move them: its TMA copies are paced by the links, not by "
        "the SMs it holds, in (0, 1]; omitted: HybridEP costed as DeepEP's SM-paced kernels",
    )


class GpuSpec(Strict):
    model: str | None = Field(
        None,
        description="the GPU's model (e.g. H100-SXM5-80GB); a calibration measured on another "
        "GPU family is applied with a warning",
    )
    memory_bytes: Annotated[float, Field(gt=0, le=2.0**60, allow_inf_nan=False)] = Field(
        description="memory per GPU, bytes"
    )
    cuda_memory_bytes: Annotated[float, Field(gt=0, le=2.0**60, allow_inf_nan=False)] | None = (
        Field(
            None,
            description="the device memory CUDA reports (cudaDeviceProp.totalGlobalMem, "
            "torch.cuda.get_device_properties().total_memory): what an allocator can have, "
            "bytes; datasheets count GiB as GB; default: memory_bytes",
        )
    )
    compute_capability: (
        Annotated[list[Annotated[int, Field(ge=0, le=100)]], Field(min_length=2, max_length=2)]
        | None
    ) = Field(
        None,
        description="the CUDA compute capability [major, minor]; what kernels a library picks "
        "reads it (Transformer Engine: FP8 GEMMs of any layout from 10.0)",
    )
    mem_bw: Bandwidth = Field(description="memory (HBM) bandwidth, bytes/s")
    peak_flops: Annotated[
        dict[Dtype, Annotated[float, Field(gt=0, le=1e21, allow_inf_nan=False)]],
        Field(min_length=1),
    ] = Field(description="dense peak FLOP/s per dtype (fp32, tf32, fp16, bf16, fp8, fp4)")
    roofline: RooflineParams | None = Field(
        None, description="roofline parameters of compute kernels (costs.roofline overrides them)"
    )
    alpha_beta: ComputeFits | None = Field(
        None,
        description="fits t = alpha + beta * work per compute or copy kind (PipeMoE Eq. 13), "
        "one for every dtype or one per dtype; used with costs.compute: alpha_beta",
    )
    interference: Interference | None = Field(
        None,
        description="relative speeds of stream kinds while others run (MPipeMoE Fig. 3); "
        "default 1 (no slowdown)",
    )
    dispatch: DispatchParams | None = Field(
        None, description="seconds from a task being ready to its start; default 0"
    )
    gemm: GemmModelParams | None = Field(
        None,
        description="the GEMM model: output tiles in waves over the SMs against the bytes "
        "moved (sim.hardware.costs.gemm); omitted: GEMMs on the plain roofline",
    )
    sms: Annotated[int, Field(gt=0, le=100_000)] | None = Field(
        None,
        description="streaming multiprocessors; tasks may reserve SMs only where the GPU "
        "has a count; default: gemm.sms",
    )
    resources: ResourceParams | None = Field(
        None,
        description="SM and HBM sharing, hardware queues and host launch cost "
        "(sim.hardware.costs.resources); omitted: SMs shared ideally, (S - k)/S, and no "
        "bandwidth term",
    )
    kernels: KernelParams | None = Field(
        None,
        description="what a training step's kernels reach on this GPU (GEMM, grouped GEMM, "
        "attention and memory-bound shares of the peaks, launch gap); omitted or None per "
        "field: unknown",
    )


_ENDS = (
    "a device of the node (gpu0, gpu1, ... or a name in node.devices) or a list of them; "
    "lists on both sides pair element-wise, a single name fans out to every name of the other"
)


class LinkEntry(Strict):
    """Links of the node template: a list on both sides pairs element-wise; a single name
    on one side fans out to every name of the other."""

    a: Name | Annotated[list[Name], Field(min_length=1)] = Field(description=_ENDS)
    b: Name | Annotated[list[Name], Field(min_length=1)] = Field(description=_ENDS)
    class_: Name = Field(alias="class", description="link class of these links (of link_classes)")

    @model_validator(mode="after")
    def _same_length(self) -> "LinkEntry":
        if isinstance(self.a, list) and isinstance(self.b, list) and len(self.a) != len(self.b):
            raise ValueError(f"lists a ({len(self.a)}) and b ({len(self.b)}) differ in length")
        return self


class NodeSpec(Strict):
    devices: dict[Name, Literal[DEVICE_TYPES]] | None = Field(  # type: ignore[valid-type]
        None,
        description="node-local devices besides the GPUs (which are gpu0..gpu{n-1}): name -> "
        "nvswitch, pcie_switch, host or nic",
    )
    links: list[LinkEntry] | None = Field(
        None, description="the links inside a node, each in both directions"
    )
    nic_of_gpu: Annotated[list[Name], Field(min_length=1)] | None = Field(
        None,
        description="the fabric-attached NIC each GPU sends through, one per GPU in order; "
        "default: each GPU's nearest NIC",
    )


# what each fabric field means, shared with the run config's `fabric:` overrides
FABRIC_FIELDS = {
    "type": "switch (one non-blocking switch), fat_tree (two levels: nodes_per_leaf, "
    "oversubscription) or rail (rail-optimised: nodes_per_unit, planes)",
    "class": "link class (of the topology's link_classes) of the links between an attached "
    "device and its leaf switch",
    "attach": "node devices wired to the fabric; default: the node's NICs",
    "nodes_per_leaf": "fat_tree: nodes whose attached devices share one leaf switch; default 1",
    "nodes_per_unit": "rail: nodes per scalable unit, whose i-th attached devices share leaf "
    "(unit, i); default 1",
    "oversubscription": "fat_tree, rail: a leaf's uplinks to the spines carry ports x bw / "
    "oversubscription; default 1 (non-blocking)",
    "planes": "rail: single (one network) or multi (each rail its own plane: traffic to "
    "another rail is relayed over NVLink to the GPU on the destination's rail first, as NCCL "
    "PXN); default single",
}


class FabricSpec(Strict):
    """The network between nodes (`sim.hardware.topology.fabric`); also the run config's `fabric:`
    overrides, merged over a topology's before this check."""

    type: Literal[FABRIC_TYPES] = Field(description=FABRIC_FIELDS["type"])  # type: ignore[valid-type]
    class_: Name = Field(alias="class", description=FABRIC_FIELDS["class"])
    attach: Annotated[list[Name], Field(min_length=1)] | None = Field(
        None, description=FABRIC_FIELDS["attach"]
    )
    nodes_per_leaf: Annotated[int, Field(gt=0, le=10**6)] | None = Field(
        None, description=FABRIC_FIELDS["nodes_per_leaf"]
    )
    nodes_per_unit: Annotated[int, Field(gt=0, le=10**6)] | None = Field(
        None, description=FABRIC_FIELDS["nodes_per_unit"]
    )
    oversubscription: Annotated[float, Field(ge=1, le=1e3, allow_inf_nan=False)] | None = Field(
        None, description=FABRIC_FIELDS["oversubscription"]
    )
    planes: Literal["single", "multi"] | None = Field(None, description=FABRIC_FIELDS["planes"])

    @model_validator(mode="after")
    def _fields_of_type(self) -> "FabricSpec":
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
    alpha: Seconds = Field(
        0.0, description="start-up seconds per message in flow mode (costs.alpha overrides it)"
    )


class TopologySpec(Strict):
    name: Name = Field(description="the topology's name (a preset's is its file name)")
    description: str | None = Field(None, description="what the topology models; free text")
    nodes: PosInt = Field(
        1, description="default node count; a run's `nodes` (or --nodes) overrides it"
    )
    gpus_per_node: Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE)] = Field(
        description="GPUs per node, named gpu0..gpu{n-1} in node.links"
    )
    gpu: GpuSpec = Field(
        description="the GPU: memory, bandwidth, peak FLOP/s and its cost model parameters"
    )
    node: NodeSpec = Field(description="the devices and links inside one node")
    fabric: FabricSpec | None = Field(
        None, description="the network between nodes; omitted: the topology is one node only"
    )
    link_classes: Annotated[dict[Name, LinkClassSpec], Field(min_length=1)] = Field(
        description="link classes by name: bandwidth, latency, efficiency, message cost"
    )
    network: NetworkSpec | None = Field(None, description="parameters of every message")
    collectives: Collectives | None = Field(
        None,
        description="fits t = alpha + beta * bytes per collective kind (PipeMoE Eq. 16), one "
        "for every group size or a list by group size; used with costs.network: collective",
    )
    shared_cpu: SharedCpu | None = Field(
        None,
        description="the ranks are processes sharing one CPU host (its cores, threads per "
        "rank, memory bandwidth): kernels and collectives slow by their share of it "
        "(sim.hardware.costs.host); omitted: every rank has a device of its own",
    )
