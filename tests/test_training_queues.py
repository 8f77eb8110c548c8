"""The training step on the GPU's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS): the step's
graph is built in the host's issue order, so that one queue runs it as Megatron-Core's
schedules launch it (`sim.training.pipeline.step_graph`); each run gets the queues
Megatron-Bridge's scripts set (`recipe.bridge_queues`) unless its recipe records them or its
row names them."""

from __future__ import annotations

import pytest

from sim.core.errors import ConfigError
from sim.core.issue import stuck
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.training.pipeline import Phase, StagePrograms, step_graph
from sim.training.predict import parse_row, predict_rows, prepare, read_table
from sim.training.recipe import Recipe, bridge_queues, recipe_for
from tests.bad_inputs import PREDICT_ROW

ROW = PREDICT_ROW  # a Llama 3 8B run on one DGX H100


def _costs(topo: Topology, queues: int) -> CostModel:
    return CostModel.build(
        topo, {"network": "collective", "resources": {"max_connections": queues}}
    )


def _programs(pp: int, vp: int, tf: float, tb: float, ep_s: float = 0.0) -> list[StagePrograms]:
    """Per stage and chunk: a forward of `tf` and a backward of `tb` seconds of compute, each
    split around an EP collective of `ep_s` where given."""

    def one(t: float) -> list[Phase]:
        if not ep_s:
            return [Phase("compute", t, "all")]
        half = Phase("compute", t / 2, "half")
        return [half, Phase("comm", ep_s, "dispatch", kind="all_to_all"), half]

    return [
        StagePrograms([one(tf) for _ in range(vp)], [one(tb) for _ in range(vp)]) for _ in range(pp)
    ]


@pytest.mark.parametrize("pp,vp,micro", [(2, 1, 4), (4, 1, 8), (4, 2, 8), (8, 5, 16)])
def test_one_queue_keeps_the_bubble_formula_with_free_communication(
    pp: int, vp: int, micro: int
) -> None:
    """With free communication the step on one queue per GPU is the ideal GA x (tf + tb)
    plus the bubble (PP - 1) / (VP x GA) of it, as on a queue per stream: the builder's
    order is one a host issues (no task waits behind one it feeds)."""
    tf, tb = 1e-3 / vp, 2e-3 / vp
    topo = Topology.load("flat-switch", nodes=pp)
    g = step_graph(
        _programs(pp, vp, tf, tb), list(range(pp)), topo.world_size, micro, vp, 0.0, False
    )
    assert stuck(list(g)) == []
    span = simulate(g, topo, _costs(topo, 1)).makespan
    ideal = micro * vp * (tf + tb)
    assert span == pytest.approx(ideal * (1 + (pp - 1) / (vp * micro)), rel=1e-9)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("pp,vp", [(2, 1), (4, 2)])
def test_one_queue_runs_the_builders_order_and_is_never_faster(
    pp: int, vp: int, overlap: bool
) -> None:
    """With sends, receives and EP collectives (merged forward / backward pairs where
    `overlap`), one queue runs the graph as built, and sharing it costs time, never gains."""
    topo = Topology.load("flat-switch", nodes=pp)
    progs = _programs(pp, vp, 1e-3, 2e-3, ep_s=0.4e-3)
    g = step_graph(progs, list(range(pp)), topo.world_size, 8, vp, 0.1e-3, overlap)
    assert stuck(list(g)) == []
    one = simulate(g, topo, _costs(topo, 1)).makespan
    many = simulate(g, topo, _costs(topo, 32)).makespan
    assert one >= many * (1 - 1e-12)
    if overlap:  # the merged pairs' collectives run beside compute only on separate queues
        assert one > many


@pytest.mark.parametrize(
    "major,tp,cp,ep_overlap,dispatcher,queues",
    [
        (9, 1, 1, False, "alltoall", 8),  # CUDA's default
        (9, 4, 1, False, "alltoall", 1),  # TP communication overlap keeps the host's order
        (9, 1, 2, False, "deepep", 1),  # CP likewise, whatever the dispatcher
        (9, 2, 1, True, "alltoall", 8),  # EP overlap needs the queues
        (9, 1, 1, False, "deepep", 32),  # DeepEP / HybridEP: 32
        (10, 4, 2, False, "alltoall", 32),  # Blackwell: 32 always
    ],
)
def test_the_scripts_queue_rule(
    major: int, tp: int, cp: int, ep_overlap: bool, dispatcher: str, queues: int
) -> None:
    assert bridge_queues(major, tp, cp, ep_overlap, dispatcher) == queues


def test_recipes_carry_the_queues_their_rows_ran_with() -> None:
    assert recipe_for("LLAMA3_70B", "DGX-H100", "FP8", "26.02").max_connections == 1
    assert recipe_for("LLAMA3_70B", "DGX-GB200", "MXFP8", "26.02").max_connections == 32


def test_a_run_gets_the_recipes_queues_else_the_scripts_else_its_column() -> None:
    generic = Recipe()
    assert prepare(parse_row(ROW, 1), generic).recipe.max_connections == 8
    tp2 = prepare(parse_row({**ROW, "tp": "2"}, 1), generic)
    assert tp2.recipe.max_connections == 1
    assert tp2.costs.resources.max_connections == 1
    given = prepare(parse_row({**ROW, "tp": "2", "max_connections": "32"}, 1), generic)
    assert given.recipe.max_connections == given.costs.resources.max_connections == 32


@pytest.mark.parametrize("cell", ["0", "33", "2.5", "x"])
def test_a_bad_queue_count_is_a_one_line_error(cell: str) -> None:
    with pytest.raises(ConfigError, match="max_connections") as e:
        parse_row({**ROW, "max_connections": cell}, 1)
    assert "\n" not in str(e.value)


def test_ep_overlap_gains_less_on_one_queue() -> None:
    """Megatron-LM PR #6311's 14-layer DeepSeek-V3 on 64 H100 (benchmarks/heldout/
    ab_pairs.csv): EP overlap measured +7.8% with 32 queues and +3.7% with one; the step
    model's gain is smaller on one queue too (their sizes: benchmarks/results/ab_pairs.md)."""
    from benchmarks.ab_pairs import TABLE

    rows = [r for r in read_table(TABLE) if r["pair"].startswith("dsv3-14l-ep-overlap")]
    off, on32, _, on1 = (r["predicted_tokens_per_s_per_gpu"] for r in predict_rows(rows)["rows"])
    assert on32 / off > on1 / off > 1.0
