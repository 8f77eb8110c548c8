"""A published layout, as `moesim plan` scores it, has the peak memory `moesim predict` gives
its row (issue 24: the plan finds the published layout feasible): the plan's recipe for the
layout (the request's recipe with the published run's choices, its offloaded layers among
them) and the row's recipe keep the same bytes."""

from __future__ import annotations

from typing import Any

import pytest

from sim.training.plan import plan
from sim.training.plan_space import (
    Candidate,
    Request,
    base_recipe,
    candidate_row,
    candidates,
    plan_grid,
    recipe_of,
)
from sim.training.predict import MODELS, parse_row, predict_run
from sim.workload.architectures import architecture

# rows of shared/reference/published-runs/megatron_bridge_perf.csv (Megatron-Bridge's
# performance summary), as `moesim predict` reads them
HEAD = "release,system,model,variant,gpus,precision,gbs,mbs,seq_len,fsdp,tp,pp,cp,vp,ep,ga"
ROW20 = "25.11,DGX-GB200,LLAMA3_8B,,8,FP8-CS,128,2,8192,0,1,1,1,,1,8"  # Llama 3 8B, GB200
ROW3 = "26.02,DGX-GB200,LLAMA3_70B,,64,FP8,256,2,8192,64,1,1,1,,,"  # 70B, FSDP 64, MBS 2
# the published run's choices: the 70B GB200 recipe offloads 40 of 80 layers' activations
# (Megatron-Bridge LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2, recipes.yaml)
CASES = {
    "row 20": (ROW20, Candidate(1, 1, 1, 1, 1, 2)),
    "row 3": (ROW3, Candidate(1, 1, 1, 1, 1, 2, fsdp=True, offload=40)),
}


def _row(line: str) -> dict[str, Any]:
    return dict(zip(HEAD.split(","), line.split(",")))


def _request(row: dict[str, Any]) -> Request:
    return Request(
        row["model"],
        row["system"],
        int(row["gpus"]),
        int(row["gbs"]),
        int(row["seq_len"]),
        row["precision"],
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_published_layout_is_a_plan_candidate_with_predicts_memory(case: str) -> None:
    line, given = CASES[case]
    row = _row(line)
    req = _request(row)
    arch = architecture(MODELS[req.model])
    base = base_recipe(req)
    assert given in set(candidates(req, arch, 8, plan_grid(base, None)))
    run = parse_row({k: str(v) for k, v in candidate_row(req, given).items()}, 1)
    scored = predict_run(run, recipe_of(base, given, arch.mla is not None))
    published = predict_run(parse_row(row, 1))
    assert scored["peak_memory_bytes"] == pytest.approx(published["peak_memory_bytes"], rel=1e-12)
    assert scored["memory_parts"] == pytest.approx(published["memory_parts"], rel=1e-12)
    assert scored["memory_margin_bytes"] >= 0


def test_plan_given_the_fsdp_70b_layout_scores_it_feasible() -> None:
    """The plan's `--layout` scoring of GB200 Llama 3 70B FP8 (FSDP 64, MBS 2, 40 layers
    offloaded): predict's peak memory, within the GPU's."""
    line, given = CASES["row 3"]
    row = _row(line)
    grid = {"tp": (1,), "cp": (1,), "pp": (1,), "mbs": (2,), "recompute": ("none",)}
    p = plan(_request(row), given=given, grid=grid)
    assert p.given is not None and p.given.get("fits") is True, p.given
    published = predict_run(parse_row(row, 1))
    assert p.given["peak_memory_bytes"] == pytest.approx(published["peak_memory_bytes"], rel=1e-12)
    # without offloading the layout does not fit: the plan drops it for memory
    assert p.pruned.get("memory", 0) >= 1


@pytest.mark.parametrize(
    "line,dispatcher",
    [
        # GB200 DeepSeek-V3 26.02: HybridEP, a plan candidate's on Blackwell
        ("26.02,DGX-GB200,DeepSeekV3,,256,MXFP8,4096,1,4096,0,1,4,1,4,64,", "hybridep"),
        # B200 Qwen3-235B 26.02: the all-to-all dispatcher, a plan candidate's
        ("26.02,DGX-B200,Qwen3_235B_A22B,,256,MXFP8,8192,1,4096,0,1,8,1,,8,", "alltoall"),
        # a dense model has none
        (ROW20, ""),
    ],
)
def test_a_published_layout_keeps_its_recipes_dispatcher(line: str, dispatcher: str) -> None:
    """benchmarks/plan_published.py scores a published layout with its recipe's dispatcher:
    a plan candidate's where the plan has it, else the recipe's own (HybridEP scored as the
    plan's alltoall once lost its dispatch: row 9 fell from 4,295 to 3,538 tokens/s/GPU)."""
    from benchmarks.plan_published import published

    assert published(_row(line)).dispatcher == dispatcher


def test_a_later_releases_other_layout_is_reported_with_its_measured_ratio() -> None:
    """plan_published sets beside a row what a later release ran for the same model, system,
    GPUs and precision (25.11's FP8-MX is 26.02's MXFP8); an empty vp or ep is 1, another
    precision or the same layout says nothing."""
    from benchmarks.plan_published import later_runs

    row = {
        **_row("25.11,DGX-B200,Qwen3_30B_A3B,,8,FP8-MX,512,1,4096,0,1,1,1,1,8,64"),
        "tokens_per_s_per_gpu": "9299",
    }
    later = [
        {
            **row,
            "release": "26.04",
            "precision": "MXFP8",
            "mbs": "4",
            "vp": "",
            "ga": "",
            "tokens_per_s_per_gpu": "26859",
        },
        {
            **row,
            "release": "26.04",
            "precision": "BF16",
            "mbs": "4",
            "tokens_per_s_per_gpu": "20000",
        },
        {**row, "release": "26.06", "precision": "MXFP8", "vp": "", "tokens_per_s_per_gpu": "9500"},
    ]
    assert later_runs(row, later) == [
        ("26.04 MXFP8: mbs 1 -> 4, measured 26,859 (2.89x this row's 9,299)", 26859 / 9299, {"mbs"})
    ]


def test_a_plan_ahead_of_the_published_layout_says_whether_a_later_run_confirms_it() -> None:
    from benchmarks.plan_published import verdict

    runs = [("x", 2.89, {"mbs"}), ("y", 1.5, {"gbs"})]
    assert "also changed mbs and measured 2.89x: the plan points" in verdict(runs, {"mbs", "ep"})
    for rs, changed in ((runs, {"pp"}), ([], {"mbs"}), ([("x", 1.05, {"mbs"})], {"mbs"})):
        assert "modelling error to investigate" in verdict(rs, changed)


def test_a_published_layout_over_memory_says_by_how_much_and_what_its_recipe_ran() -> None:
    """Row 31 of the shared table (25.11 B200 GPT-OSS 120B at EP8) does not fit in the
    memory model; its recipe ran EP64."""
    from benchmarks.plan_published import over_memory

    row = _row("25.11,DGX-B200,GPT_OSS_120B,,64,BF16,512,4,4096,0,1,1,1,1,8,2")
    got = over_memory({"peak_memory_bytes": 208.1e9, "memory_margin_bytes": -16.6e9}, row)
    assert got.startswith("predicted peak 208.1 GB, 16.6 GB over the GPU's")
    assert "v0.2.0 config EP64" in got
