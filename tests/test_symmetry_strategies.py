"""Every registered strategy, folded by symmetry or not, says the same thing.

`costs.symmetry: on` may only change how much is simulated, never the answer: for every
strategy of `sim.strategies.STRATEGIES` on multi-node layouts (2, 4 and 8 DGX H100 nodes;
expert parallelism inside a node and across nodes; data-parallel replicas), the run through
`sim.commands.simulate_config` with symmetry on gives the makespan and summary of the run
with it off. A strategy whose graph cannot be folded exactly must be refused (the summary
says why), never folded wrongly: DeepEP's all-to-allv across nodes was folded with only the
representatives' per-peer sizes and came out 2.5x too fast at 64 GPUs (issue 21, item 1).

The default run covers every strategy on one layout (each layout in turn); the whole grid
runs with `pytest -m slow`.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from sim import commands
from sim.strategies import STRATEGIES
from tests.golden import outputs

MODEL = {**outputs.MODEL, "dtype": "bf16"}  # the golden cases' layer
PARAMS: dict[str, dict[str, Any]] = {  # the smallest graphs each strategy builds
    "ted": {"tp": 2},
    "megatron_ep": {"layers": 1, "micro": 2, "heads": 8},
    "dualpipe": {"layers": 1, "micro": 4, "variant": "dualpipev", "pp": 2},
}
LAYOUTS: list[tuple[int, dict[str, int]]] = [  # (nodes, parallel)
    (2, {"ep": 16}),  # EP across two nodes: one node can stand for both
    (4, {"ep": 8, "dp": 4}),  # EP inside a node, replicas across nodes
    (4, {"ep": 16, "dp": 2}),  # EP across nodes, replicated
    (8, {"ep": 64}),  # EP across eight nodes (DeepEP's 2x at 64 GPUs)
    (8, {"ep": 16, "dp": 4}),
]
# Keys that say how the run was done, not what it found.
EFFORT = {"stats", "symmetry", "fidelity", "wall_s"}


def _parallel(name: str, parallel: dict[str, int]) -> dict[str, int]:
    if name == "ted":  # its tensor-parallel experts take a factor 2 of the expert ranks
        return {**parallel, "ep": parallel["ep"] // 2, "tp": 2}
    return parallel


def _config(name: str, nodes: int, parallel: dict[str, int], symmetry: str) -> dict[str, Any]:
    return {
        "topology": "dgx-h100",
        "nodes": nodes,
        "model": MODEL,
        "strategy": {"name": name, **PARAMS.get(name, {})},
        "parallel": _parallel(name, parallel),
        "passes": ["fwd", "bwd"],
        # FasterMoE's skewed exchanges at 64 GPUs pass the default flow-count guard
        "limits": {"max_skewed_flows": 10**6},
        "costs": {"symmetry": symmetry},
    }


def _cases():
    for i, name in enumerate(STRATEGIES):
        for j, (nodes, parallel) in enumerate(LAYOUTS):
            fast = j == i % len(LAYOUTS)  # every strategy once, every layout in turn
            marks = () if fast else (pytest.mark.slow,)
            yield pytest.param(name, nodes, parallel, id=f"{name}-{nodes}n-{parallel}", marks=marks)


def _assert_close(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{k}]")
    elif isinstance(a, float) and isinstance(b, float) and not (math.isnan(a) and math.isnan(b)):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


@pytest.mark.parametrize("name, nodes, parallel", list(_cases()))
def test_symmetry_on_equals_off(name, nodes, parallel):
    on = commands.simulate_config(_config(name, nodes, parallel, "on")).summary
    off = commands.simulate_config(_config(name, nodes, parallel, "off")).summary
    sym = on.get("symmetry") or {}
    # what was folded, or the sentence saying why not: never silent
    assert sym.get("used") or sym.get("reason"), sym
    _assert_close(
        {k: v for k, v in on.items() if k not in EFFORT},
        {k: v for k, v in off.items() if k not in EFFORT},
        name,
    )


def test_deepep_across_nodes_is_refused_by_auto_with_the_reason():
    """The reported case: 64 GPUs, EP64 on eight nodes, the default `auto`."""
    auto = commands.simulate_config(_config("deepep", 8, {"ep": 64}, "auto")).summary
    off = commands.simulate_config(_config("deepep", 8, {"ep": 64}, "off")).summary
    assert auto["makespan_s"] == pytest.approx(off["makespan_s"], rel=1e-9)
    assert not auto["symmetry"]["used"]
    assert "all_to_allv" in auto["symmetry"]["reason"]


def test_folding_still_applies_where_exact():
    """The equality above is not bought by refusing everything: uniform strategies across
    nodes and replicated DeepEP inside a node are still folded."""
    for name, nodes, parallel in (("pipelined", 8, {"ep": 64}), ("deepep", 4, {"ep": 8, "dp": 4})):
        sym = commands.simulate_config(_config(name, nodes, parallel, "on")).summary["symmetry"]
        assert sym["used"] and sym["ranks_simulated"] < sym["ranks"], (name, sym)
