"""Outputs that used to read as something they were not (issue 21, items 3-5):

- a skewed routing's shorter makespan is for fewer tokens (capacity drops the excess): every
  summary, compare row, sweep row and what-if says how many (token, expert) choices one MoE
  layer routed, kept and dropped, and a comparison of rows that keep different numbers says
  their times are not for the same work;
- peak memory compares across strategies: model states (weights, gradients, Adam's states)
  are counted alike for every strategy in their own column, beside the activations;
- `--network collective` on a topology without measured fits is the flow model's own fit:
  the summary says where every fit came from.
"""

from __future__ import annotations

import json

import pytest

import sim
from sim import commands
from sim.analysis.compare import compare
from sim.analysis.summary import format_summary, summarize
from sim.config import RunConfig
from sim.core.graph import TaskGraph

ZIPF = {"model.routing": {"kind": "zipf", "s": 1.2, "seed": 0}}
# the demo's layer: 16 GPUs x top-2 x 4096 tokens = 131,072 (token, expert) choices
CHOICES = 16 * 2 * 4 * 1024


@pytest.fixture(scope="module")
def uniform():
    return sim.run("sim/configs/demo.yaml")


@pytest.fixture(scope="module")
def skewed():
    return sim.run("sim/configs/demo.yaml", **ZIPF)


# -- item 3: tokens kept and dropped ---------------------------------------------------------------


def test_skew_reports_the_tokens_capacity_dropped(uniform, skewed):
    u, z = uniform.summary["tokens_per_layer"], skewed.summary["tokens_per_layer"]
    assert (u["routed"], u["kept"], u["dropped"], u["dropped_fraction"]) == (CHOICES, CHOICES, 0, 0)
    assert z["routed"] == CHOICES and z["kept"] + z["dropped"] == CHOICES
    # the speed-up of the issue is work not done: a third and more of the choices dropped
    assert skewed.summary["makespan_s"] < uniform.summary["makespan_s"]
    assert z["dropped_fraction"] > 0.3 and z["policy"] == "capacity" and z["capacity"] == 308
    text = format_summary(skewed.summary)
    assert f"dropped {z['dropped']:,}" in text and "capacity C=308" in text
    json.dumps(skewed.summary)  # summary.json holds it


def test_comparisons_across_work_say_so(uniform, skewed):
    from sim.analysis.summary import work_note

    note = work_note([uniform.summary, skewed.summary], ["uniform", "zipf"])
    kept = skewed.summary["tokens_per_layer"]["kept"]
    assert note and "not for the same work" in note and f"{kept:,}" in note
    assert work_note([uniform.summary, uniform.summary], ["a", "b"]) is None
    w = sim.whatif("sim/configs/demo.yaml", {"model.routing.s": 1.2})
    assert any("not for the same work" in n for n in w.after["whatif"]["notes"])


def test_compare_rows_carry_tokens_and_a_note_when_they_differ(tmp_path):
    """Dropless DeepEP keeps every choice where the capacity-bound sequential layer drops."""
    cfg = commands.load_config(_demo_with(ZIPF))
    res = commands.compare_strategies(cfg, ["sequential", "deepep"], tmp_path / "cmp")
    df = res.table.set_index("strategy")
    assert df.loc["deepep", "tokens_dropped"] == 0
    assert df.loc["deepep", "tokens_kept"] == df.loc["sequential", "tokens_routed"] == CHOICES
    assert df.loc["sequential", "tokens_dropped"] > 0
    md = res.markdown()
    assert "not for the same work" in md and "kept / dropped per layer" in md
    csv = (tmp_path / "cmp" / "results.csv").read_text().splitlines()[0].split(",")
    for col in ("tokens_kept", "tokens_dropped", "dropped_fraction", "model_state_bytes"):
        assert col in csv
    assert "not for the same work" in (tmp_path / "cmp" / "compare.md").read_text()


def test_sweep_rows_carry_tokens_and_memory():
    from sim.analysis.sweep import run_sweep

    spec = {"base": _demo_with(ZIPF), "grid": {"strategy": ["sequential"]}}
    df = run_sweep(spec, workers=1)
    row = df.iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["tokens_routed"] == CHOICES and 0 < row["tokens_dropped"] < CHOICES
    assert row["tokens_kept"] + row["tokens_dropped"] == CHOICES
    assert 0.3 < row["dropped_fraction"] < 1
    assert row["peak_memory_bytes"] == pytest.approx(
        row["peak_activation_bytes"] + row["model_state_bytes"]
    )


def test_a_graph_without_the_counts_reports_unknown_not_zero(uniform, tmp_path):
    doc = json.loads(json.dumps(uniform.graph.to_dict()))  # a copy: to_dict shares meta
    assert doc["meta"]["tokens_per_layer"]["kept"] == CHOICES  # a graph JSON carries them
    for k in ("tokens_per_layer", "model_states"):
        doc["meta"].pop(k)
    g = TaskGraph.from_dict(doc)
    s = commands.replay_graph(g, "dgx-a100", 2).summary
    assert s["tokens_per_layer"]["kept"] is None and s["tokens_per_layer"]["dropped"] is None
    assert s["model_state_bytes"] is None and s["peak_memory_bytes"] is None
    assert "unknown" in format_summary(s)
    path = tmp_path / "g.json"
    uniform.graph.to_json(path)  # with its meta: the replay reports them
    back = commands.replay_graph(str(path), "dgx-a100", 2).summary
    assert back["tokens_per_layer"]["kept"] == CHOICES
    assert back["model_state_bytes"] == uniform.summary["model_state_bytes"]


# -- item 4: memory compares across strategies -----------------------------------------------------


def test_model_states_are_counted_alike_and_apart_from_activations():
    entries = ["sequential", "mpipemoe"] + [
        f"mpipemoe:degree=4,reuse={r}" for r in ("none", "S1", "S2", "S3", "S4")
    ]
    df = compare(RunConfig.demo(), entries).set_index("strategy")
    states = df["model_state_bytes"]
    assert states.nunique() == 1 and states.iloc[0] > 0  # the same layer, the same states
    # bf16 Adam, 16 bytes per parameter: the gate [M, E] and 2 local experts' w1, b1, w2, b2
    M, H, E = 2048, 8192, 32
    params = M * E + 2 * (2 * M * H + H + M)
    assert states.iloc[0] == pytest.approx(16 * params)
    total = df["peak_activation_bytes"] + df["model_state_bytes"]
    assert df["peak_memory_bytes"].to_numpy() == pytest.approx(total.to_numpy())
    # MPipeMoE's reuse still shows in the activations, now without its model states in them
    none = df.loc["mpipemoe:degree=4,reuse=none", "peak_activation_bytes"]
    for r in ("S1", "S2", "S3", "S4"):
        assert df.loc[f"mpipemoe:degree=4,reuse={r}", "peak_activation_bytes"] < none
    assert df.loc["mpipemoe", "peak_activation_bytes"] < states.iloc[0]  # (it held 1 GiB more)


def test_out_of_memory_compares_the_sum(uniform):
    res = uniform.sim
    s = uniform.summary
    saved = res.topology.gpu["memory_bytes"]
    try:  # room for the activations, not for the model states beside them
        res.topology.gpu["memory_bytes"] = s["peak_activation_bytes"] + s["model_state_bytes"] / 2
        out = summarize(res, uniform.trace)
    finally:
        res.topology.gpu["memory_bytes"] = saved
    assert out["oom"] and out["peak_activation_bytes"] < out["gpu_memory_bytes"]
    assert "OUT OF MEMORY" in format_summary(out)


# -- item 4: every builder counts one layer's activations alike ------------------------------------
# MPipeMoE's tensors (Sec. II-B) under one rule (sim.strategies.activations): on the demo layer
# every GPU dispatches and computes B = E*C = 32 x 308 rows, M = 2048, H = 8192, bf16
B, M, H, ELEM = 32 * 308, 2048, 8192, 2
T_I = B * M * ELEM


def test_the_same_schedule_holds_the_same_activations():
    from sim.workload import memory as mm

    reuse = [f"mpipemoe:degree=4,reuse={r}" for r in ("S1", "S2", "S3", "S4")]
    entries = [
        "sequential",
        *(f"pipelined:degree={n},order=alternating" for n in (2, 4)),
        *(f"mpipemoe:degree={n},reuse=none" for n in (1, 2, 4)),
        *reuse,
    ]
    df = compare(RunConfig.demo(), entries).set_index("strategy")
    peak, ms = df["peak_activation_bytes"], df["makespan_s"]
    for n in (2, 4):  # pipelined in MPipeMoE's order (Fig. 4b) is MPipeMoE without reuse
        want = peak[f"pipelined:degree={n},order=alternating"]
        assert peak[f"mpipemoe:degree={n},reuse=none"] == pytest.approx(want, rel=1e-9)
    # the paper's figures: a sequential step stashes Eq. 2 and adds two adjacent gradients
    # (Eq. 3); a pipelined one holds every gradient at once (Eq. 4)
    eq2 = mm.activations(B, M, H)
    assert peak["sequential"] == pytest.approx((eq2 + mm.buffers_sequential(B, M, H)) * ELEM)
    want = (eq2 + mm.buffers_pipelined(B, M, H)) * ELEM
    assert peak["mpipemoe:degree=4,reuse=none"] == pytest.approx(want, rel=1e-9)
    # n = 1 is not the sequential schedule: MPipeMoE sends the dispatch gradient as soon as
    # fc1's input gradient is out, so dT_I arrives while fc1's weight gradient still holds
    # dT_M (the shared builder sends it after the weight gradient): one dT_I more, sooner
    one = "mpipemoe:degree=1,reuse=none"
    assert ms[one] < ms["sequential"]
    assert peak[one] == pytest.approx(peak["sequential"] + T_I, rel=1e-9)
    for r in reuse:  # MPipeMoE's reuse saves what Eq. 5 says
        assert peak[r] < peak["mpipemoe:degree=4,reuse=none"]


def _peak_and_input(name: str, params: dict, passes=None):
    """A strategy's activation peak on the demo and the bytes of the largest T_I it
    allocates (every builder names the layer's tensors alike)."""
    from sim.engine.engine import simulate
    from sim.hardware.costs import CostModel
    from sim.strategies import Cluster, build

    cfg = RunConfig.demo()
    topo = cfg.load_topology()
    costs = CostModel.build(topo, cfg.costs)
    g = build(name, cfg.layer(topo.world_size), params, passes or cfg.passes, Cluster(topo, costs))
    inputs = [b for t in g for n, b in t.allocs.items() if n.rsplit("/", 1)[-1] == "T_I"]
    return float(simulate(g, topo, costs).mem_peak.max()), max(inputs, default=0.0)


ON_THE_DEMO = [
    "sequential",
    "pipelined",
    "pipemoe",
    "tutel",
    "ted",
    "lancet",
    "fastermoe",
    "mpipemoe",
    "parm",
    "deepep",
    "megatron_ep",
]


@pytest.mark.parametrize("name", ON_THE_DEMO)
def test_every_strategys_activations_include_the_layers_input(name):
    peak, t_i = _peak_and_input(name, {})
    assert peak >= t_i > 0
    if name not in ("deepep", "megatron_ep"):  # dropless: T_I is their T tokens' rows
        assert t_i == pytest.approx(T_I / (2 if name == "ted" else 1))  # TED: a C/tp slice


def test_dualpipes_activations_include_the_layers_input():
    """DualPipe's stages need GPUs beside the demo's EP group: a small layer on one node."""
    from sim.engine.engine import simulate
    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology
    from sim.strategies import build
    from sim.workload.moe import MoELayer

    layer = MoELayer(batch=1, seq_len=64, model_dim=128, hidden_dim=256, experts=8, world=2)
    g = build("dualpipe", layer, {"pp": 4, "layers": 1, "shared": 0}, ("fwd", "bwd"))
    topo = Topology.load("dgx-h100", nodes=1)
    peak = simulate(g, topo, CostModel.build(topo, {})).mem_peak
    inputs = {t.rank for t in g for n in t.allocs if n.endswith("/T_I")}
    assert inputs == set(range(8)) and (peak > 0).all()


def test_a_forward_alone_holds_the_layers_input():
    peak, t_i = _peak_and_input("sequential", {}, ("fwd",))
    assert t_i == T_I and peak >= T_I


# -- item 5: where the costs came from -------------------------------------------------------------


def test_network_collective_says_its_fits_are_the_flow_models(uniform):
    r = sim.run("sim/configs/demo.yaml", costs={"network": "collective"})
    src = r.summary["cost_sources"]
    a2a = src["collectives"]["all_to_all"]
    assert a2a["source"].startswith("derived from the flow model on this topology")
    assert a2a["fits"] and a2a["fits"][0]["ranks"] == 16
    assert src["network"] == {"model": "collective", "source": "config"}
    assert src["compute"]["model"] == "roofline"
    text = format_summary(r.summary)
    assert "collective costs" in text and "reproduces flow" in text
    # which is why the two agree: a fit of the flow model's own times
    assert r.summary["makespan_s"] == pytest.approx(uniform.summary["makespan_s"], rel=1e-9)
    assert "collective costs" not in format_summary(uniform.summary)  # flow: none used


def test_given_fits_name_their_source():
    fits = {"all_to_all": {"alpha": 2e-5, "beta": 3e-10}}
    r = sim.run("sim/configs/demo.yaml", costs={"network": "collective", "collectives": fits})
    a2a = r.summary["cost_sources"]["collectives"]["all_to_all"]
    assert a2a["source"] == "config" and a2a["fits"][0]["alpha_s"] == 2e-5
    assert "config for all_to_all" in format_summary(r.summary)


@pytest.mark.filterwarnings("ignore:calibration file")  # the recorded file is format 1
def test_a_calibration_files_fits_name_the_file():
    from pathlib import Path

    from sim.hardware.costs import CostModel
    from sim.hardware.topology import Topology

    cal = Path(__file__).resolve().parents[1] / "reports/validation-localhost-gloo/calibration.yaml"
    topo = Topology.load("localhost-cpu", nodes=1)
    src = CostModel.build(topo, {"calibration": str(cal)}).cost_sources()
    assert src["collectives"] and all(
        v["source"] == f"calibration file {cal}" for v in src["collectives"].values()
    )
    assert src["compute"]["model"] == "alpha_beta"
    assert set(src["compute"]["fits"].values()) == {f"calibration file {cal}"}


def _demo_with(overrides: dict) -> dict:
    """The demo config as a mapping with dotted overrides applied."""
    raw = RunConfig.demo().to_dict()
    for key, value in overrides.items():
        node = raw
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return raw
