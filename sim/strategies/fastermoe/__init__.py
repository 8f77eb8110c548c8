"""FasterMoE (He et al., PPoPP'22): smart schedule and dynamic shadowing, with its greedy rule.

Smart schedule (group-wise exchange). The P ranks are cut into n = P/g groups of g
consecutive ranks. Each all-to-all becomes n steps: at step s a rank in group G sends the
tokens meant for the experts of group (G + s) mod n and receives from group (G - s) mod n
(step 0 is its own group). The expert compute of step s starts as soon as that step's
tokens are in, and the combine of step s (outputs back to group G - s) is queued after
that compute, so later steps' exchanges overlap earlier steps' compute. The steps are
queued on the communication stream(s) in one of `sim.strategies.chunking.ORDERS`: `tutel` (all
dispatch steps, then all combine steps) is how FastMoE's implementation queues them
(cuda/fastermoe/smart_schedule.h). The backward pass runs the same steps on the gradients.

One step on one rank is g sends and g receives in one NCCL group call (FastMoE); here it is
one all_to_allv whose split is zero outside the step's partner groups. Its members are the
ranks the step chains together: group G talks to G + s and G - s, so the groups with the
same residue modulo gcd(n, s) form one exchange (step 0: each group alone), and no rank
waits for a rank it never talks to, even through others.

Dynamic shadowing. A hot expert's parameters (w1 [M, H], b1 [H], w2 [H, M], b2 [M]) are
broadcast from its owner to every rank before the layer needs them (forward, second
communication stream, pipelined ring broadcast as NCCL's); every rank then runs that
expert on its own tokens, which leave the all-to-all; in backward the shadow copies'
weight gradients are summed over ranks (an all-reduce; the owner keeps the sum). With
`shadow: auto` the choice is FasterMoE's greedy rule (`sim.strategies.fastermoe.rule`) on
the layer's token counts, after an all-gather of the per-expert counts, as FasterMoE does
before deciding.

Token counts come from the layer's routing (`MoELayer.tokens_matrix`): FasterMoE drops no
tokens, so skewed routing shows its load imbalance when the capacity C is at least the
largest per-(rank, expert) count: `model.dropless: true` makes it so.
"""

from __future__ import annotations

from typing import Any

from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph
from sim.strategies.base import Strategy
from sim.strategies.chunking import comm_order
from sim.strategies.fastermoe.builder import _RankBuilder
from sim.strategies.fastermoe.layout import step_layout
from sim.strategies.fastermoe.selector import choose_shadow, group_layout, parse_shadow
from sim.strategies.resolved import Resolved
from sim.strategies.steps import PASSES, require_whole_experts
from sim.workload.moe import MoELayer
from sim.workload.slicing import layer_meta

__all__ = ["NAME", "STRATEGY", "build", "group_layout", "parse_shadow", "resolve"]

NAME = "fastermoe"


def pair_weight(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], blocks: Any = None
) -> float:
    """Memory per rank pair in sim.strategies.PAIR_BYTES units (checked against
    limits.max_pairs): the group-wise exchange's steps each hold per-peer splits and
    arrays, ~4.4 KB a pair per pass (peak RSS of the demo, forward and backward: 0.55 GB at
    256 GPUs, 2.26 GB at 512)."""
    return 1 + 70 * max(1, len(passes))


def resolve(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> Resolved:
    """The parameters the graph is built with: `shadow: auto` by the greedy rule."""
    shadow, info = choose_shadow(layer, params, passes, cluster)
    chosen = {"shadow": list(shadow)} if params["shadow"] == "auto" else {}
    return Resolved({**params, "shadow": list(shadow)}, chosen, info)


def build(
    layer: MoELayer, params: dict[str, Any], passes: tuple[str, ...], cluster: Any = None
) -> TaskGraph:
    for p in passes:
        if p not in PASSES:
            raise ConfigError(f"passes: expected entries from {PASSES}, got {p!r}")
    require_whole_experts(layer, NAME)
    g, n = group_layout(layer.world, params["group_size"])
    seq = comm_order(n, params["order"])  # checks the order
    res = resolve(layer, params, passes, cluster)
    shadow, info = tuple(res.params["shadow"]), res.info
    lay = step_layout(layer, g, n, shadow)
    graph = TaskGraph(
        layer.world,
        meta={
            "strategy": NAME,
            "group_size": g,
            "steps": n,
            "order": params["order"],
            "shadow": list(shadow),
            "selector": info,
            "passes": list(passes),
            "layer": layer_meta(layer),
        },
    )
    auto = params["shadow"] == "auto"
    world = list(range(layer.world))
    rings = {o: world[o:] + world[:o] for o in {e // layer.local_experts for e in shadow}}
    for rank in range(layer.world):
        b = _RankBuilder(layer, lay, rank, passes, seq, auto, world, rings)
        for p in passes:
            b.pass_(p)
        b.place_tensors()
        for tasks in b.streams.values():
            for t in tasks:
                graph.add(t)
    graph.validate()
    return graph


STRATEGY = Strategy(
    name=NAME,
    Params="sim.strategies.params:FasterMoEParams",
    build=build,
    real_layer="fastermoe",
    resolve=resolve,
    pair_weight=pair_weight,
)
