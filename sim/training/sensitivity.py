"""What paces a predicted training step: its sensitivity to each of the machine's resources.

Each resource is made FASTER times faster in turn and the step simulated again:
- `gpu`: the GPU's dense peaks of every dtype, its HBM bandwidth and its per-kernel floor
  (`kernel_s`), so every kernel's time divides by FASTER;
- `host`: the CPU's time per launched operation (`launch_s`), which paces the step where the
  host, not the GPU, is the slower side (after a host sync: `sim.training.kernels.stretch`);
- `links`: the bandwidth of every link class of the topology (NVLink, PCIe, NICs, fabric);
  per-message costs and latencies stay, so a latency-bound collective gains little.

The sensitivity is the elasticity ln(step / step') / ln(FASTER): 1 where the step scales
fully with that resource, 0 where it does not depend on it. They need not sum to 1 (a resource
can hide another, or two can pace in turn). A faster resource never slows the step: a negative
value would be a modelling defect, and the tests hold every value at >= 0.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any

FASTER = 1.25  # each resource 25% faster: enough to move a bound step, small enough to stay local
RESOURCES = ("gpu", "host", "links")


def _faster_links(topo: Any, factor: float) -> Any:
    """The topology with every link class's bandwidth times `factor`."""
    from sim.hardware.topology import Topology

    spec = copy.deepcopy(topo.spec)
    for cls in spec["link_classes"].values():
        if "bw" in cls:
            cls["bw"] = float(cls["bw"]) * factor
    return Topology(spec, nodes=topo.nodes, source=topo.source)


def _step_s(p: Any, gpu: Any = None, topo: Any = None) -> float:
    """The step of a prepared run (`sim.training.predict.prepare`), with a GPU or topology
    other than its own where given (the collectives simulated again on another topology)."""
    from sim.hardware.costs import CostModel
    from sim.training.comm import CommTimer
    from sim.training.step import run_step
    from sim.training.step_costs import step_costs

    comm, costs = p.comm, p.costs
    if topo is None:
        topo = p.topo
    else:
        comm = CommTimer(topo, CostModel.build(topo, {}), p.layout, p.comm.per_domain)
        costs = step_costs(topo, p.recipe.max_connections)
    return run_step(
        p.arch, p.layout, p.precision, p.recipe, gpu or p.gpu, comm, topo, costs, p.imbalance
    ).step_s


def sensitivities(p: Any, step_s: float) -> dict[str, float]:
    """Each resource's elasticity of the step of prepared run `p` (its step: `step_s`)."""
    g = p.gpu
    faster = {
        "gpu": lambda: _step_s(
            p,
            gpu=replace(
                g,
                peak={k: v * FASTER for k, v in g.peak.items()},
                mem_bw=g.mem_bw * FASTER,
                kernel_s=g.kernel_s / FASTER,
            ),
        ),
        "host": lambda: _step_s(p, gpu=replace(g, launch_s=g.launch_s / FASTER)),
        "links": lambda: _step_s(p, topo=_faster_links(p.topo, FASTER)),
    }
    return {k: math.log(step_s / faster[k]()) / math.log(FASTER) for k in RESOURCES}


def bound_by(sens: dict[str, float]) -> str:
    """The resource the step is most sensitive to."""
    return max(RESOURCES, key=lambda k: sens[k])
