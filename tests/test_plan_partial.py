"""Full recomputation of the first N layers of each model chunk (Megatron-Core's block
method, `--recompute-num-layers N`): the step and memory models' reading of N, and `moesim
plan`'s search for the fewest N that fit (`sim.training.plan_partial`)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from sim.hardware.topology import Topology
from sim.training.kernels import GpuKernels
from sim.training.layout import Layout
from sim.training.memory import step_memory
from sim.training.plan_parse import parse_layout
from sim.training.plan_space import Candidate, Request, base_recipe
from sim.training.precision import PRECISIONS
from sim.training.recipe import Recipe
from sim.training.step import StepModel
from sim.workload.architectures import architecture
from tests.configs import NoComm

# Llama 3 8B on 8 H100, 8K sequences, micro-batch 2, no TP, CP or pipeline: over memory
# without recomputation, within it recomputing every layer
REQ = Request("LLAMA3_8B", "DGX-H100", 8, 32, 8192, "BF16")
GRID = {"tp": (1,), "cp": (1,), "pp": (1,), "mbs": (2,)}


def _model(lay: Layout, recipe: Recipe) -> StepModel:
    topo = Topology.load("dgx-h100", nodes=max(1, lay.gpus // 8))
    gpu = GpuKernels.from_gpu(topo.gpu, "test")
    arch = architecture("llama3-8b")
    return StepModel(arch, lay, PRECISIONS["BF16"], recipe, gpu, NoComm())  # type: ignore[arg-type]


def _peak(lay: Layout, recipe: Recipe) -> float:
    m = _model(lay, recipe)
    return step_memory(m, m.chunk_work()).peak_bytes


def test_n_counts_the_first_layers_of_each_model_chunk():
    """Megatron-Core's `checkpointed_forward` loops over one chunk's TransformerBlock
    (`num_layers_per_pipeline_rank = len(self.layers)`): with PP 2 x VP 2 (chunks of 8 of
    the 32 layers), N = 2 recomputes layers 0-1, 8-9, 16-17 and 24-25, two per chunk."""
    lay = Layout(gpus=8, tp=1, pp=2, vp=2, gbs=16, seq=4096)
    m = _model(lay, Recipe(recompute_full=True, recompute_layers=2))
    got = {layer for layer in range(32) if m.recomputed("", layer)}
    assert got == {0, 1, 8, 9, 16, 17, 24, 25}


def test_memory_of_n_layers_lies_between_none_and_full_and_falls_with_n():
    for lay, chunk in (
        (Layout(gpus=8, tp=1, pp=1, mbs=2, gbs=32, seq=8192), 32),
        (Layout(gpus=8, tp=1, pp=2, vp=2, mbs=1, gbs=16, seq=8192), 8),
    ):
        none = _peak(lay, Recipe())
        full = _peak(lay, Recipe(recompute_full=True))
        peaks = [_peak(lay, Recipe(recompute_full=True, recompute_layers=n)) for n in range(1, 9)]
        assert full < none
        assert all(full <= p <= none for p in peaks)
        assert all(a > b for a, b in zip(peaks, peaks[1:]))  # each layer more saves some
        if chunk == 8:  # every layer of each chunk: full recomputation
            assert peaks[-1] == pytest.approx(full, rel=1e-12)


@pytest.fixture(scope="module")
def planned():
    from sim.training.plan import plan

    return plan(REQ, grid=GRID, prune=False)


def test_the_plan_adds_the_fewest_layers_that_fit(planned):
    """Each layout over memory without recomputation and within it recomputing every layer
    gets one candidate recomputing the fewest layers that fit: N fits, N - 1 does not."""
    from sim.training.plan_bound import Screener

    p = planned
    assert p.partial == {"searched": 2, "found": 2, "added": 2}  # with FSDP and without
    partial = [c for c in p.candidates if c["recompute_layers"]]
    assert len(partial) == 2 and all(c["recompute"] == "full" and c["fits"] for c in partial)
    s = Screener(REQ, base_recipe(REQ))
    for c in partial:
        cand = Candidate(1, 1, 1, 1, 1, 2, recompute="full", fsdp=bool(c["fsdp"]))
        n = c["recompute_layers"]
        assert 1 <= n < 32
        assert s.fits(replace(cand, recompute_layers=n))
        assert not s.fits(replace(cand, recompute_layers=n - 1))
        assert not s.fits(replace(cand, recompute="none"))
        # its bounds stay below its simulated step
        assert c["lower_bound_s"] <= c["predicted_step_s"]
        assert c["comm_bound_s"] <= c["predicted_step_s"] * (1 + 1e-9)
        # and it beats recomputing every layer of the same layout
        whole = next(
            x
            for x in p.candidates
            if x["fsdp"] == c["fsdp"] and x["recompute"] == "full" and not x["recompute_layers"]
        )
        assert c["predicted_step_s"] < whole["predicted_step_s"]
        assert c["peak_memory_bytes"] > whole["peak_memory_bytes"]
    assert p.candidates[0]["recompute_layers"]  # the best
    from sim.training.plan_report import text_plan

    assert "2 recomputing the fewest layers per model chunk that fit" in text_plan(p)


def test_no_partial_candidate_where_recomputing_nothing_fits():
    """At 4K and micro-batch 1, FSDP fits recomputing nothing (no partial candidate); the
    distributed optimizer does not, and recomputing 3 layers of 32 beats FSDP there."""
    from sim.training.plan import plan

    req = replace(REQ, seq_len=4096)
    p = plan(req, grid={**GRID, "mbs": (1,), "recompute": ("none", "full")}, prune=False)
    assert p.partial == {"searched": 1, "found": 1, "added": 1}
    assert [(c["fsdp"], c["recompute_layers"]) for c in p.candidates if c["recompute_layers"]] == [
        (0, p.candidates[0]["recompute_layers"])
    ]
    assert any(c["fsdp"] and c["recompute"] == "none" and c["fits"] for c in p.candidates)


def test_best_csv_carries_n_and_predict_reproduces_it(planned, tmp_path: Path):
    from sim.training.plan_report import best_row
    from sim.training.predict import predict_rows, read_table

    (tmp_path / "best.csv").write_text(best_row(planned))
    rows = read_table(tmp_path / "best.csv")
    best = planned.candidates[0]
    assert rows[0]["recompute"] == "full"
    assert int(rows[0]["recompute_layers"]) == best["recompute_layers"] > 0
    got = predict_rows(rows)["rows"][0]
    assert "reason" not in got, got.get("reason")
    assert got["predicted_step_s"] == pytest.approx(best["predicted_step_s"], rel=1e-9)


def test_layout_reads_recompute_layers_and_keeps_old_keys():
    c = parse_layout("tp=1,pp=2,vp=2,recompute=full,recompute_layers=3")
    assert (c.recompute, c.recompute_layers) == ("full", 3)
    assert "recompute_layers=3" in c.canonical() and c.label().endswith("recompute=full:3")
    assert "recompute_layers" not in Candidate(1, 1, 1, 1, 1, 1).canonical()  # old journals
    assert c.screen_key() != replace(c, recompute_layers=0).screen_key()
    for text, needle in (
        ("recompute=full,recompute_layers=0", "expected an integer >= 1"),
        ("recompute_layers=2", "needs recompute=full"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_layout(text)


def test_a_given_n_beyond_a_chunk_is_refused_and_a_fitting_one_is_ranked():
    from sim.training.plan import plan

    with pytest.raises(ConfigError, match="at most 8 layers") as e:
        plan(REQ, given=parse_layout("pp=2,vp=2,recompute=full,recompute_layers=9"), grid=GRID)
    assert "\n" not in str(e.value)
    given = parse_layout("mbs=2,fsdp=on,recompute=full,recompute_layers=20")
    p = plan(REQ, given=given, grid=GRID)
    assert p.given is not None and p.given["recompute_layers"] == 20 and p.given["fits"]


def test_a_published_row_with_num_layers_keeps_its_step():
    """Llama 3 8B on DGX-H100 FP8-CS (25.11) recomputes 5 layers (recipes.yaml `num_layers:
    5`) at PP 1: one chunk per stage, so N per chunk is N per stage (the first 5 layers,
    as before N was read per chunk); the same N given as predict's choice columns gives the
    same step, and recomputing every layer a longer one."""
    from sim.training.predict import parse_row, predict_run, prepare
    from sim.training.step import StepModel

    src = Path(__file__).resolve().parents[1] / "sim" / "configs" / "predict_demo.csv"
    row = next(
        r
        for r in csv.DictReader(src.read_text().splitlines())
        if (r["model"], r["system"], r["release"]) == ("LLAMA3_8B", "DGX-H100", "25.11")
    )
    run = parse_row(row, 1)
    p = prepare(run)
    model = StepModel(p.arch, p.layout, p.precision, p.recipe, p.gpu, p.comm)
    assert p.recipe.recompute_layers == 5 and p.layout.pp == p.layout.vp == 1
    recomputed = [i for i in range(p.arch.layers) if model.recomputed("attn", i)]
    assert recomputed == [0, 1, 2, 3, 4]
    got = predict_run(run)
    again = predict_run(parse_row({**row, "recompute": "full", "recompute_layers": "5"}, 1))
    assert again["predicted_step_s"] == got["predicted_step_s"]
    every = predict_run(parse_row({**row, "recompute": "full"}, 1))
    assert every["predicted_step_s"] > got["predicted_step_s"]


@pytest.mark.parametrize(
    "cols,needle",
    [
        ({"recompute_layers": "-1"}, "recompute_layers: expected an integer >= 0"),
        ({"recompute": "selective", "recompute_layers": "2"}, "but recompute is 'selective'"),
    ],
)
def test_predicts_recompute_layers_column_fails_in_one_line(cols, needle):
    from sim.training.predict import parse_row
    from tests.bad_inputs import PREDICT_ROW

    row = {**PREDICT_ROW, **cols}
    with pytest.raises(ConfigError, match=needle) as e:
        parse_row(row, 1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "first,then",
    [
        (Candidate(1, 1, 1, 1, 1, 2), Candidate(1, 1, 1, 1, 1, 2, offload=10)),
        (Candidate(1, 1, 1, 1, 1, 2), Candidate(1, 1, 1, 1, 1, 2, recompute="full")),
        (
            Candidate(1, 1, 2, 2, 1, 2, recompute="full"),
            Candidate(1, 1, 2, 2, 1, 2, recompute="full", recompute_layers=3),
        ),
    ],
)
def test_the_screening_memory_is_the_step_models_whatever_was_screened_before(first, then):
    """The screening model shares a layer's saved bytes between candidates of a layout: the
    layers fully recomputed or offloaded are told apart (a candidate screened after another
    of its layout gets its own memory, not the other's)."""
    from sim.training.plan_bound import Screener, _ScreenModel

    s = Screener(REQ, base_recipe(REQ))
    got = []
    for c in (first, then):
        p = s.prepared(c)
        m = _ScreenModel(s, p)
        plain = StepModel(p.arch, p.layout, p.precision, p.recipe, p.gpu, NoComm(), p.imbalance)  # type: ignore[arg-type]
        got.append(step_memory(m, m.chunk_work()).peak_bytes)
        assert got[-1] == pytest.approx(step_memory(plain, plain.chunk_work()).peak_bytes)
    assert got[0] != got[1]
