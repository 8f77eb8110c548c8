"""DualPipe / DualPipeV as the training step's pipeline (`sim.training.pipeline_kind`,
`sim.training.dualpipe_schedule`): the published bubble in the degenerate case, against 1F1B,
the EP overlap of its pairs, two copies of the parameters, refused layouts and the plan's
pipeline dimension with its bounds."""

from __future__ import annotations

import pytest

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.strategies.dualpipe.schedule import table
from sim.training.dualpipe_schedule import dualpipe_graph
from sim.training.pipeline import Phase, StagePrograms, step_graph
from sim.training.pipeline_kind import Placement
from sim.training.plan_parse import parse_grid, parse_layout
from sim.training.plan_space import Request, check_given
from sim.training.predict import parse_row, predict_rows, prepare

F, B, W = 1e-3, 2e-3, 1e-3  # a chunk's forward, full backward and its weight part: F = B - W


def _progs(n: int, chunks: int, fwd: list[Phase], bwd: list[Phase]) -> list[StagePrograms]:
    return [StagePrograms([fwd] * chunks, [bwd] * chunks) for _ in range(n)]


def _run(g, n: int):
    topo = Topology.load("flat-switch", nodes=n)
    return simulate(g, topo, CostModel.build(topo, {"network": "collective"}))


def _dual(kind: str, pp: int, ga: int, fwd, bwd, p2p: float = 0.0, overlap: bool = False):
    pipe = Placement(kind, pp).pipe(ga)
    g = dualpipe_graph(_progs(pp, 2, fwd, bwd), list(range(pp)), pp, pipe, p2p, overlap)
    return g, _run(g, pp), pipe


@pytest.mark.parametrize(
    "kind,pp,ga", [("dualpipe", 4, 8), ("dualpipe", 6, 14), ("dualpipev", 3, 6)]
)
def test_bubble_is_the_published_formula_with_free_comm(kind, pp, ga):
    """Free communication, F = B - W (the zero-bubble analysis' assumption): every device
    idles (PP/2 - 1)(F&B + B - 3W), F&B = F + B, PP the stages (DualPipeV: 2 pp)."""
    one = [Phase("compute", F, "f")]
    g, res, pipe = _dual(kind, pp, ga, one, [Phase("compute", B, "b", wgrad=W)])
    expect = table(pipe.pp, F, B, W, F + B)[kind]["bubble"]
    dur = res.end - res.start
    for d in range(pp):
        busy = sum(dur[i] for i, t in enumerate(g) if t.rank == d and t.stream == "compute")
        assert busy == pytest.approx(pipe.per_phase * 2 * (F + B), rel=1e-9)
        assert res.makespan - busy == pytest.approx(expect, rel=1e-9, abs=1e-12), d
    if kind == "dualpipe" and pp == 4:  # by hand: one F&B + B - 3W = 2 ms
        assert res.makespan == pytest.approx(8 * (F + B) + 2e-3, rel=1e-9)


def test_dualpipe_beats_1f1bs_bubble_at_the_same_pp_and_micro_batches():
    """pp = 4, 8 micro-batches, the same chunk of layers per stage: 1F1B idles (pp-1)(F+B)
    = 9 ms, DualPipe 2 ms (its B split into input and weight gradients)."""
    one = lambda t: [Phase("compute", t, "x")]  # noqa: E731
    g = step_graph(_progs(4, 1, one(F), one(B)), list(range(4)), 4, 8, 1, 0.0, overlap=False)
    plain = _run(g, 4).makespan
    assert plain == pytest.approx(8 * (F + B) + 3 * (F + B), rel=1e-9)
    _, res, _ = _dual("dualpipe", 4, 8, one(F), [Phase("compute", B, "b", wgrad=W)])
    assert res.makespan - 8 * (F + B) == pytest.approx(2e-3, rel=1e-9)
    assert res.makespan < plain


def test_a_pairs_all_to_alls_run_beside_the_other_passes_compute():
    """With EP overlap a pair's collectives hide behind the other pass's compute."""
    a2a = Phase("comm", 0.5e-3, "dispatch", kind="all_to_all")
    fwd = [Phase("compute", F / 2, "a"), a2a, Phase("compute", F / 2, "b")]
    bwd = [
        Phase("compute", B / 2, "a", wgrad=W / 2),
        a2a,
        Phase("compute", B / 2, "b", wgrad=W / 2),
    ]
    spans = [_dual("dualpipev", 2, 8, fwd, bwd, 1e-5, ov)[1].makespan for ov in (False, True)]
    assert spans[1] < spans[0]


def _row(pp: int, pipeline: str, **kw: str) -> dict[str, str]:
    row = {
        "system": "DGX-H100",
        "model": "Qwen3_30B_A3B",
        "gpus": "8",
        "precision": "BF16",
        "gbs": "32",
        "mbs": "1",
        "seq_len": "4096",
        "fsdp": "0",
        "tp": "1",
        "pp": str(pp),
        "cp": "1",
        "vp": "",
        "ep": "2",
        "ga": "",
        "pipeline": pipeline,
        "recompute": "full",
    }
    return row | kw


def test_dualpipe_keeps_two_copies_of_the_parameters_dualpipev_one():
    """Per device, the parameters of its two chunks: DualPipe's (two stages of pp) sum to
    twice the model over the pipeline, DualPipeV's (two of 2 pp) and 1F1B's to once; the
    activations peak at PP + 1 chunks."""
    from sim.training.memory import step_memory
    from sim.training.plan_bound import FreeComm
    from sim.training.step import StepModel

    totals, state = {}, {}
    for kind in ("1f1b", "dualpipe", "dualpipev"):
        p = prepare(parse_row(_row(4, kind), 1))
        m = StepModel(p.arch, p.layout, p.precision, p.recipe, p.gpu, FreeComm())
        works = m.chunk_work()
        assert [len(w) for w in works] == [1 if kind == "1f1b" else 2] * 4
        totals[kind] = sum(sum(m.params(lw)) for dev in works for ch in dev for lw in ch)
        state[kind] = step_memory(m, works).parts["model_state"]
    assert totals["dualpipe"] == pytest.approx(2 * totals["1f1b"], rel=1e-12)
    assert totals["dualpipev"] == pytest.approx(totals["1f1b"], rel=1e-12)
    assert state["dualpipe"] > 1.8 * state["dualpipev"]
    for kind, stages in (("dualpipe", 4), ("dualpipev", 8)):
        place = Placement(kind, 4)
        peaks = {max(sum(h) for h in place.held_counts(8, s)) for s in range(4)}
        assert peaks == {stages + 1}


@pytest.mark.parametrize(
    "pp,pipeline,kw,needle",
    [
        (3, "dualpipe", {"gpus": "6"}, "pipeline: dualpipe needs an even pp >= 2"),
        (4, "dualpipev", {"vp": "2"}, "needs vp=1, got vp=2"),
        (4, "dualpipe", {"gbs": "12"}, "needs >= 8 and even micro-batches per step"),
        (1, "dualpipev", {}, "pipeline: dualpipev needs pp >= 2"),
        (2, "zb", {}, "pipeline: expected one of"),
    ],
)
def test_a_layout_that_cannot_run_it_is_refused_in_one_line(pp, pipeline, kw, needle):
    res = predict_rows([_row(pp, pipeline, **kw)])
    reason = res["rows"][0]["reason"]
    assert needle in reason and "\n" not in reason, reason


def test_a_given_layout_is_refused_naming_the_pipeline_and_the_grid_takes_it():
    req = Request("Qwen3_30B_A3B", "DGX-H100", 8, 32, 4096, "BF16")
    c = parse_layout("pp=2,ep=2,pipeline=dualpipev")
    assert c.pipeline == "dualpipev" and "dualpipev" in c.label()
    check_given(req, c, 132, 48)
    with pytest.raises(ConfigError, match="--layout: pipeline: dualpipe needs an even pp") as e:
        check_given(req, parse_layout("pp=1,ep=2,pipeline=dualpipe"), 132, 48)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="pipeline: expected one of"):
        parse_layout("pp=2,pipeline=gpipe")
    assert parse_grid(["pipeline=1f1b,dualpipev"]) == {"pipeline": ("1f1b", "dualpipev")}
    with pytest.raises(ConfigError, match="pipeline: 'zb' is not one of 1f1b, dualpipe"):
        parse_grid(["pipeline=zb"])


def test_the_plan_searches_the_pipeline_and_its_bounds_hold_for_dualpipe():
    """The pipeline is a dimension of the plan where the layout runs it; the bounds
    (compute, floors, simulated collectives) stay below the simulated step, for the
    DualPipe layout given too (two copies of the parameters: it does not fit)."""
    from sim.training.plan import plan

    req = Request("Qwen3_30B_A3B", "DGX-H100", 8, 16, 4096, "BF16")
    grid = {"tp": (1,), "pp": (2,), "vp": (1,), "ep": (4,), "mbs": (1,), "recompute": ("full",)}
    grid |= {"cp": (1,), "dispatcher": ("alltoall",)}
    given = parse_layout(
        "pp=2,ep=4,recompute=full,dispatcher=alltoall,overlap=on,pipeline=dualpipe"
    )
    p = plan(req, given=given, grid=grid, prune=False)
    # the pipelines x EP overlap, less 1F1B with the overlap (Megatron-Core refuses it at vp 1),
    # and 1F1B recomputing the fewest layers that fit (it does not fit recomputing none)
    assert p.considered == 3 * 2 - 1 + 1
    assert p.partial == {"searched": 2, "found": 1, "added": 1}
    assert {c["pipeline"] for c in p.candidates} == {"1f1b", "dualpipev"}
    assert p.pruned == {"memory": 1}  # DualPipe without overlap; the given one is simulated
    assert p.given is not None and p.given["pipeline"] == "dualpipe" and not p.given["fits"]
    for c in [*p.candidates, p.given]:
        assert c["lower_bound_s"] <= c["comm_bound_s"] * (1 + 1e-9)
        assert c["comm_floor_s"] <= c["comm_bound_s"] * (1 + 1e-9)
        assert c["comm_bound_s"] <= c["predicted_step_s"] * (1 + 1e-9), c["pipeline"]


def test_a_v_of_more_stages_than_layers_is_neither_searched_nor_accepted():
    """DualPipeV cuts the model into 2 x pp stages: on 32 devices DeepSeek-V3's 61 layers
    cannot fill 64 (a plan on 256 GB200 once crashed on it); such layouts are not candidates
    and a given one is refused in one line."""
    from sim.training.pipeline_kind import runs
    from sim.training.plan_space import candidates
    from sim.workload.architectures import architecture

    arch = architecture("deepseek-v3")
    assert runs("dualpipev", 16, 1, 64, arch.layers) and not runs("dualpipev", 32, 1, 64, 61)
    req = Request("DeepSeekV3", "DGX-GB200", 256, 4096, 4096, "MXFP8")
    grid = {"tp": (1,), "cp": (1,), "pp": (32,), "vp": (1,), "ep": (8,), "mbs": (1,)}
    kinds = {c.pipeline for c in candidates(req, arch, 8, grid)}
    assert kinds == {"1f1b", "dualpipe"}
    with pytest.raises(ConfigError, match="64 stages, more than its 61 layers"):
        check_given(req, parse_layout("pp=32,ep=8,pipeline=dualpipev"), 148, arch.layers)
