"""`moesim plan`: pruning never drops the optimum, memory feasibility is the memory model's,
bad requests fail in one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from sim.training.plan import plan
from sim.training.plan_parse import parse_layout
from sim.training.plan_space import Candidate, Request

REQ = Request("LLAMA3_8B", "DGX-H100", 8, 16, 4096, "BF16")
GRID = {
    "tp": (1, 2),
    "cp": (1,),
    "pp": (1, 2),
    "vp": (1, 2),
    "mbs": (1, 2),
    "recompute": ("none", "full"),
}


@pytest.fixture(scope="module")
def exhaustive():
    return plan(REQ, grid=GRID, prune=False)


def test_the_pruned_plan_finds_the_exhaustive_optimum(exhaustive):
    pruned = plan(REQ, grid=GRID)
    assert pruned.simulated < exhaustive.simulated  # the bound removed some
    key = ("tp", "cp", "pp", "vp", "ep", "mbs", "fsdp", "ep_overlap", "recompute")
    best = exhaustive.candidates[0]
    assert {k: pruned.candidates[0][k] for k in key} == {k: best[k] for k in key}
    assert pruned.candidates[0]["predicted_step_s"] == pytest.approx(best["predicted_step_s"])
    assert pruned.considered == exhaustive.considered
    assert pruned.pruned["bound"] > 0


def test_every_bound_is_below_its_simulated_step(exhaustive):
    """The compute bound and the bound with the collectives' floors are below the bound with
    the collectives simulated, which is below the simulated step."""
    for c in exhaustive.candidates:
        assert c["lower_bound_s"] <= c["comm_bound_s"] * (1 + 1e-9)
        assert c["comm_floor_s"] <= c["comm_bound_s"] * (1 + 1e-9)
        assert c["comm_bound_s"] <= c["predicted_step_s"] * (1 + 1e-9)


def test_ranked_candidates_fit_and_are_in_order(exhaustive):
    speeds = [c["predicted_tokens_per_s_per_gpu"] for c in exhaustive.candidates]
    assert speeds == sorted(speeds, reverse=True)
    assert [c["rank"] for c in exhaustive.candidates] == list(range(1, len(speeds) + 1))
    for c in exhaustive.candidates:
        assert c["fits"] and c["peak_memory_bytes"] <= 81089 * 2**20  # CUDA's total of an H100
    assert exhaustive.considered == exhaustive.simulated + sum(exhaustive.pruned.values())


def test_a_given_layout_that_does_not_fit_is_scored_and_says_so():
    """Llama 3 70B split by TP 4 alone cannot hold its weights and gradients on an H100."""
    req = Request("LLAMA3_70B", "DGX-H100", 64, 64, 4096, "BF16")
    p = plan(
        req,
        given=parse_layout("tp=4,pp=1,mbs=1"),
        grid={"tp": (4,), "pp": (1, 8), "vp": (1,), "mbs": (1,), "recompute": ("none",)},
    )
    assert p.given is not None and p.given["fits"] is False and p.given["rank"] >= 1
    assert all(c["fits"] for c in p.candidates)


def test_bad_requests_fail_in_one_line():
    with pytest.raises(ConfigError, match="no layout divides 7 GPUs with GBS 16"):
        plan(Request("LLAMA3_8B", "DGX-H100", 7, 16, 4096, "BF16"), grid=GRID)
    with pytest.raises(ConfigError, match=r"no layout of DeepSeekV3 on 8 GPUs .* fits: .*memory"):
        plan(
            Request("DeepSeekV3", "DGX-H100", 8, 64, 4096, "BF16"),
            grid={"pp": (1,), "vp": (1,), "mbs": (1,), "recompute": ("full",)},
        )
    with pytest.raises(ConfigError, match="unknown model 'GPT9'"):
        plan(Request("GPT9", "DGX-H100", 8, 16, 4096, "BF16"))
    with pytest.raises(ConfigError, match="gpus: expected an integer >= 1"):
        plan(Request("LLAMA3_8B", "DGX-H100", 0, 16, 4096, "BF16"))


@pytest.mark.parametrize(
    "text,needle",
    [
        ("tp=x", "tp: expected an integer"),
        ("pp=0", "pp: expected an integer >= 1"),
        ("foo=1", "unknown key 'foo'"),
        ("tp", "expected KEY=VALUE"),
        ("overlap=maybe", "overlap: expected on or off"),
        ("queues=33", "queues: expected an integer >= 0 and <= 32"),
    ],
)
def test_layout_option_errors(text, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_layout(text)


def test_layout_option_parses_every_field():
    c = parse_layout(
        "tp=2,cp=2,pp=4,vp=3,ep=8,mbs=2,overlap=on,recompute=full,fsdp=on,dispatcher=deepep,"
        "sms=48,queues=1"
    )
    assert c == Candidate(2, 2, 4, 3, 8, 2, True, "full", True, "deepep", 48, queues=1)


def test_cli_plan_json_and_best_row_for_predict(tmp_path: Path):
    args = [
        sys.executable,
        "-m",
        "sim.cli",
        "plan",
        "LLAMA3_8B",
        "--system",
        "DGX-H100",
        "--gpus",
        "8",
        "--gbs",
        "16",
        "--seq-len",
        "4096",
        "--layout",
        "tp=1,pp=1,mbs=1",
        "--json",
        "--out",
        str(tmp_path / "p"),
    ]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["considered"] >= out["simulated"] >= 1 and out["candidates"][0]["rank"] == 1
    assert out["given"]["rank"] >= 1
    best = tmp_path / "p" / "best.csv"
    p = subprocess.run(
        [sys.executable, "-m", "sim.cli", "predict", str(best), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["rows"][0]
    assert row["predicted_tokens_per_s_per_gpu"] > 0 and "reason" not in row


def test_plan_from_python_is_the_cli_plan():
    import sim

    out = sim.plan("LLAMA3_8B", "DGX-H100", gpus=8, gbs=16, seq_len=4096, layout="tp=1,mbs=1")
    assert out["candidates"][0]["rank"] == 1 and out["given"]["rank"] >= 1
    with pytest.raises(ConfigError, match="workers: expected an integer >= 1"):
        sim.plan("LLAMA3_8B", "DGX-H100", 8, 16, 4096, workers=0)


# -- the MoE choices, resuming, Dask, progress --------------------------------------------

MOE = Request("Qwen3_30B_A3B", "DGX-H100", 8, 16, 4096, "BF16")
MOE_GRID = {
    "tp": (1,),
    "cp": (1,),
    "pp": (2,),
    "vp": (1,),
    "ep": (4,),
    "mbs": (1,),
    "recompute": ("full",),
    "comm_sms": (0, 48),
}
KEY = ("tp", "cp", "pp", "vp", "ep", "mbs", "fsdp", "ep_overlap", "dispatcher", "comm_sms")


def test_moe_choices_are_searched_and_pruning_keeps_the_optimum():
    """EP overlap x dispatcher (all-to-all, DeepEP) x DeepEP's SMs: every pair simulated,
    SMs only for DeepEP; the pruned plan finds the exhaustive optimum."""
    exhaustive = plan(MOE, grid=MOE_GRID, prune=False)
    choices = {(c["ep_overlap"], c["dispatcher"], c["comm_sms"]) for c in exhaustive.candidates}
    assert choices == {
        (ov, d, sms)
        for ov in (False, True)
        for d, sms in (("alltoall", 0), ("deepep", 0), ("deepep", 48))
    }
    for c in exhaustive.candidates:  # the bounds, with communication and without
        assert c["lower_bound_s"] <= c["comm_bound_s"] * (1 + 1e-9)
        assert c["comm_floor_s"] <= c["comm_bound_s"] * (1 + 1e-9)
        assert c["comm_bound_s"] <= c["predicted_step_s"] * (1 + 1e-9)
    pruned = plan(MOE, grid=MOE_GRID)
    assert {k: pruned.candidates[0][k] for k in KEY} == {
        k: exhaustive.candidates[0][k] for k in KEY
    }


def test_hybridep_is_searched_where_the_gpu_gives_its_share_of_the_links():
    """On Blackwell HybridEP's kernels have a cost of their own (links, not SMs), so the plan
    searches them; on Hopper the step model costs them as DeepEP's, which it already
    searches. A grid that names the dispatchers is taken as it is."""
    on_b200 = plan(replace(MOE, system="DGX-B200", precision="MXFP8"), grid=MOE_GRID, prune=False)
    dispatchers = {c["dispatcher"] for c in on_b200.candidates}
    assert dispatchers == {"alltoall", "deepep", "hybridep"}

    def shapes(d: str) -> list[tuple]:
        got = [c for c in on_b200.candidates if c["dispatcher"] == d]
        assert {c["comm_sms"] for c in got} == {0}  # its own SMs: not a searched dimension
        return sorted((c["ep_overlap"], c["recompute"], c["recompute_layers"]) for c in got)

    assert shapes("hybridep") == shapes("alltoall")  # the same layouts, another dispatcher
    assert {c["dispatcher"] for c in plan(MOE, grid=MOE_GRID, prune=False).candidates} == {
        "alltoall",
        "deepep",
    }
    named = plan(MOE, grid={**MOE_GRID, "dispatcher": ("hybridep",)}, prune=False)
    assert {c["dispatcher"] for c in named.candidates} == {"hybridep"}


SMALL = {"tp": (1, 2), "pp": (1,), "vp": (1,), "mbs": (1,), "recompute": ("none", "full")}


def _same_plan(a, b) -> None:
    """Equal plans, up to the CPU seconds each simulation took and the journal counts."""

    def strip(p):
        d = json.loads(json.dumps(p.as_dict(), default=str))
        d.pop("resumed")
        for c in d["candidates"]:
            c.pop("cpu_s")
        return d

    assert strip(a) == strip(b)


class _Killed(Exception):
    pass


def test_a_killed_plan_resumes_from_its_journal(tmp_path: Path):
    """Killed after two simulated candidates (raised from the progress callback, as a kill
    would stop it; unpruned, so that several are simulated), run again into the same
    folder: the two are taken from the journal, the rest simulated, and the plan is the
    uninterrupted one; the files are written once, as a set, at the end."""
    whole = plan(REQ, grid=SMALL, prune=False)
    states = []

    def kill_after_two(s):
        states.append((s.settled, s.total))
        if s.simulated == 2 and s.resumed == 0:
            raise _Killed

    out = tmp_path / "plan"
    with pytest.raises(_Killed):
        plan(REQ, grid=SMALL, prune=False, out=out, progress=kill_after_two)
    assert not (out / "plan.json").exists()  # no results before the set is complete
    lines = (out / "candidates.jsonl").read_text().splitlines()
    assert len(lines) == 2
    with open(out / "candidates.jsonl", "a") as f:  # a line torn by the kill
        f.write('{"fingerprint": "')
    seen = []
    again = plan(REQ, grid=SMALL, prune=False, out=out, progress=lambda s: seen.append(s.settled))
    assert again.resumed == 2 and again.simulated == whole.simulated
    _same_plan(again, whole)
    assert seen[-1] == again.considered  # the bar ends full
    assert [n for n, _ in states] == sorted(n for n, _ in states)  # and only moves forward
    assert {"plan.csv", "plan.parquet", "plan.json", "plan.html", "best.csv"} <= {
        p.name for p in out.iterdir()
    }
    assert len((out / "candidates.jsonl").read_text().splitlines()) == whole.simulated
    # a third run simulates nothing; another request in the same folder resumes nothing
    assert plan(REQ, grid=SMALL, prune=False, out=out).resumed == whole.simulated
    other = Request("LLAMA3_8B", "DGX-H100", 8, 32, 4096, "BF16")
    assert plan(other, grid=SMALL, prune=False, out=out).resumed == 0


def test_plan_on_processes_and_dask_is_the_same_plan():
    distributed = pytest.importorskip("distributed")
    whole = plan(REQ, grid=SMALL, prune=False)
    _same_plan(plan(REQ, grid=SMALL, prune=False, workers=2), whole)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        _same_plan(plan(REQ, grid=SMALL, prune=False, scheduler=cluster.scheduler_address), whole)


def test_grid_option():
    from sim.training.plan_parse import parse_grid

    assert parse_grid(["pp=1,2", "dispatcher=deepep", "comm_sms=16,24"]) == {
        "pp": (1, 2),
        "dispatcher": ("deepep",),
        "comm_sms": (16, 24),
    }
    for bad, needle in (
        (["foo=1"], "unknown key 'foo'"),
        (["pp=x"], "pp: expected integers"),
        (["dispatcher=allgather"], "'allgather' is not one of alltoall, deepep"),
        (["pp"], "expected KEY=V1,V2"),
        (["queues=-1"], "queues: expected integers >= 0"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_grid(bad)


# -- screening on the pool, the best row for predict ----------------------------------------


def test_the_screeners_shared_work_is_the_step_models():
    """Memory and bound from the screener's cached layers equal those of a plain step model
    (collectives free), for a MoE model with MTP and dense leading layers, over pipelines,
    recomputation and FSDP."""
    from dataclasses import replace

    from sim.training.memory import step_memory
    from sim.training.plan_bound import FreeComm, Screener, lower_bound
    from sim.training.plan_space import recipe_of
    from sim.training.predict import parse_row, prepare
    from sim.training.recipe import recipe_for
    from sim.training.step import StepModel

    req = Request("DeepSeekV3", "DGX-H100", 256, 1024, 4096, "FP8")
    base = replace(recipe_for(req.model, req.system, req.precision), etp=1, mtp=None)
    s = Screener(req, base)
    from sim.training.plan_space import candidate_row

    for c in (
        Candidate(1, 1, 8, 4, 32, 1, recompute="selective"),
        Candidate(2, 1, 16, 1, 16, 1, recompute="full"),
        Candidate(1, 1, 4, 2, 64, 2, recompute="none"),
        Candidate(1, 1, 8, 4, 32, 1, recompute="full"),  # the first's layers, shared
    ):
        p = prepare(
            parse_row({k: str(v) for k, v in candidate_row(req, c).items()}, 1),
            recipe_of(base, c, True),
        )
        m = StepModel(p.arch, p.layout, p.precision, p.recipe, p.gpu, FreeComm())
        works = m.chunk_work()
        assert s.screen(c) == (step_memory(m, works).fits, lower_bound(m, works))
    assert "beyond a node" in str(s.screen(Candidate(16, 1, 1, 1, 16, 1)))


def test_pool_lazy_feed_may_wait_for_results():
    """A lazy feed that says WAIT until its first results are back (as a plan's screening
    does), on two processes; one that waits with nothing running is a one-line error."""
    from sim.core import pool
    from sim.core.errors import MoesimError

    back: list[int] = []

    def feed():
        yield 1
        yield 2
        while len(back) < 2:
            yield pool.WAIT
        yield from [10 * x for x in list(back)]

    got = []
    for item in pool.stream(abs, feed(), workers=2, lazy=True):
        if item is not None:
            back.append(item[1])
            got.append(item[1])
    assert sorted(got) == [1, 2, 10, 20]

    def stuck():
        yield pool.WAIT

    with pytest.raises(MoesimError, match="waits for results with nothing running"):
        list(pool.stream(abs, stuck(), workers=2, lazy=True))
    with pytest.raises(MoesimError, match="waits for results with nothing running"):
        list(pool.stream(abs, stuck(), workers=1, lazy=True))


def test_the_ranking_does_not_depend_on_the_workers():
    one = plan(REQ, grid=SMALL)
    two = plan(REQ, grid=SMALL, workers=2)
    strip = [{k: v for k, v in c.items() if k != "cpu_s"} for c in one.candidates]
    assert [{k: v for k, v in c.items() if k != "cpu_s"} for c in two.candidates] == strip
    assert two.simulated == len(two.candidates) + two.outranked + (two.pruned.get("failed", 0))


def test_predict_of_best_csv_reproduces_the_plans_best(tmp_path: Path):
    """best.csv carries the best candidate's dispatcher, overlap, SMs and recomputation (and
    the even pipeline, no offloading, the architecture's MTP), which predict reads."""
    from sim.training.predict import predict_rows, read_table

    p = plan(MOE, grid={**MOE_GRID, "recompute": ("none", "full")}, out=tmp_path / "p")
    best = p.candidates[0]
    rows = read_table(tmp_path / "p" / "best.csv")
    assert rows[0]["dispatcher"] == best["dispatcher"] and rows[0]["recompute"] == best["recompute"]
    assert rows[0]["ep_overlap"] == ("on" if best["ep_overlap"] else "off")
    got = predict_rows(rows)["rows"][0]
    assert "reason" not in got, got.get("reason")
    assert got["predicted_tokens_per_s_per_gpu"] == pytest.approx(
        best["predicted_tokens_per_s_per_gpu"], rel=1e-9
    )


@pytest.mark.parametrize(
    "col,value,needle",
    [
        ("dispatcher", "nccl", "dispatcher: expected one of"),
        ("ep_overlap", "maybe", "ep_overlap: expected on or off"),
        ("recompute", "some", "recompute: expected one of"),
        ("comm_sms", "-1", "comm_sms: expected an integer >= 0"),
        ("mtp", "x", "mtp: expected an integer"),
        ("num_layers", "0", "num_layers: expected an integer >= 1"),
    ],
)
def test_predict_choice_columns_fail_in_one_line(col, value, needle):
    from sim.training.predict import parse_row

    row = {
        "system": "DGX-H100",
        "model": "Qwen3_30B_A3B",
        "gpus": "8",
        "precision": "BF16",
        "gbs": "16",
        "mbs": "1",
        "seq_len": "4096",
        "fsdp": "0",
        "tp": "1",
        "pp": "1",
        "cp": "1",
        "vp": "",
        "ep": "8",
        "ga": "",
        col: value,
    }
    with pytest.raises(ConfigError, match=needle):
        parse_row(row, 3)


def test_the_page_draws_the_top_candidates_timelines(tmp_path: Path):
    """plan.html: the top candidates' steps simulated again (the plan's own steps), one above
    the other on one time axis, with why the best beats the runner-up; offline (plotly.js
    inside the page, no script fetched)."""
    from sim.training.plan_timeline import TOP

    grid = {**MOE_GRID, "pp": (1, 2), "comm_sms": (0,)}
    p = plan(MOE, grid=grid, out=tmp_path / "p", prune=False)  # pruned: one is simulated
    assert len(p.timelines) == min(TOP, len(p.candidates)) >= 2
    for t, c in zip(p.timelines, p.candidates):
        assert t.step_s == pytest.approx(c["predicted_step_s"], rel=1e-9)
        assert {b[2] for b in t.bars} >= {"forward", "backward", "EP all-to-all"}
    page = (tmp_path / "p" / "plan.html").read_text()
    assert "<script src" not in page and "time into the step, s" in page
    assert "#1: " in page and "#2: " in page and "Best vs runner-up" in page


def test_the_order_leases_new_layouts_and_holds_each_candidate_to_those_ahead():
    """Two layouts A and B, two candidates each, compute bounds 1 < 2 < 3 < 4 (A, A, B, B).
    The floors come first, in one task, and leave the order as it is; with A's first
    candidate running, the next free worker takes B's first, not A's second (A's
    collectives are being simulated); B's result prunes only what comes after it in the
    order (B's second), not A's second, which waits for A's first and is pruned by it."""
    from sim.training.plan_order import WAIT, Entry, SimOrder
    from sim.training.plan_space import base_recipe

    r = base_recipe(REQ)
    cands = [Candidate(1, 1, 1, 1, 1, m) for m in (1, 2, 3, 4)]
    entries = [Entry(k, c, r, lay, k) for k, c, lay in zip((1, 2, 3, 4), cands, "AABB")]
    o = SimOrder(entries[::-1], None, True)
    dropped: list[tuple[Candidate, str]] = []

    def step():
        return o.next(lambda e, why: dropped.append((e.c, why)), lambda e: False)

    asked = step()
    assert [e.c for e in asked] == cands and step() is WAIT  # their floors are out
    o.floors(cands, [0.5, 2.0, 3.0, 3.5])  # floor under the compute bound: it stays
    assert [e.key for e in o.pending] == [1, 2, 3, 4]
    assert step().c == cands[0] and step().c == cands[2] and step() is WAIT
    o.back(cands[2], 2.5)  # B's first took 2.5 s: below B's second's bound, not ahead of A's
    assert o.limit(cands[1]) == math.inf and o.limit(cands[3]) == 2.5
    assert step() is WAIT and dropped == [(cands[3], "bound")]
    o.back(cands[0], 1.5)
    assert step() is None and dropped[-1] == (cands[1], "bound")


def test_a_floor_moves_a_candidate_behind_the_next_one():
    """The second candidate's floor (5) puts it behind the third (compute bound 3); the
    third is simulated first, and its step (4) drops the second before any simulation; a
    compute bound the best step beats is dropped without its floor."""
    from sim.training.plan_order import Entry, SimOrder
    from sim.training.plan_space import base_recipe

    r = base_recipe(REQ)
    cands = [Candidate(1, 1, 1, 1, 1, m) for m in (1, 2, 3, 4)]
    entries = [Entry(k, c, r, (k,), k) for k, c in zip((1, 2, 3, 6), cands)]
    o = SimOrder(entries, None, True)
    dropped: list[tuple[Candidate, str]] = []

    def step():
        return o.next(lambda e, why: dropped.append((e.c, why)), lambda e: False)

    o.floors(cands[:3], [1.0, 5.0, 3.0])  # as if asked for the first three only
    o.asked.clear()
    assert step().c == cands[0]
    o.back(cands[0], 4.5)
    assert step().c == cands[2]
    o.back(cands[2], 4.0)
    assert step() is None
    assert dropped == [(cands[1], "comm_floor"), (cands[3], "bound")]


def test_two_workers_rank_as_one_over_several_layouts():
    """A pruned plan of four layouts (PP x EP) on two processes: the same ranking as on one
    (each candidate held to the steps of those ahead of it; extra ones outranked)."""
    grid = {**MOE_GRID, "pp": (1, 2), "ep": (4, 8), "comm_sms": (0,)}
    one, two = plan(MOE, grid=grid), plan(MOE, grid=grid, workers=2)
    strip = [{k: v for k, v in c.items() if k != "cpu_s"} for c in one.candidates]
    assert [{k: v for k, v in c.items() if k != "cpu_s"} for c in two.candidates] == strip
    assert two.simulated == len(two.candidates) + two.outranked + two.pruned.get("failed", 0)


def test_a_given_layout_over_memory_never_prunes_the_layouts_that_fit():
    """A `--layout` that does not fit is simulated and ranked (said not to fit), but its step
    is no bound for the others: the plan's best is still the fastest layout that fits."""
    req = Request("LLAMA3_8B", "DGX-H100", 8, 64, 4096, "BF16")
    given = parse_layout("tp=1,pp=1,mbs=8,fsdp=on,recompute=none")
    p = plan(req, given=given, grid=SMALL)
    assert p.given is not None and p.given["fits"] is False
    assert p.candidates and all(c["fits"] for c in p.candidates)
    assert p.given["predicted_step_s"] < p.candidates[0]["predicted_step_s"]  # it is faster
    whole = plan(req, grid=SMALL, prune=False)
    assert p.candidates[0]["predicted_step_s"] == pytest.approx(
        whole.candidates[0]["predicted_step_s"]
    )


def test_a_request_starts_from_its_release_s_recipe_else_the_newest():
    """`Request.release` picks the recipe its candidates start from (recipes.yaml), and each
    candidate's row carries it, so that `predict` runs the same recipe; no release: the
    newest recorded (DeepSeek-V3 on GB200 in MXFP8: 26.02 graphs attention and the router,
    26.08 the whole iteration)."""
    from sim.training.plan_space import Request, base_recipe, candidate_row
    from sim.training.recipe import releases

    kw = dict(model="DeepSeekV3", system="DGX-GB200", gpus=256, gbs=4096, seq_len=4096)
    old = Request(**kw, precision="MXFP8", release="26.02")
    new = Request(**kw, precision="MXFP8")
    assert "26.02" in releases("DeepSeekV3", "DGX-GB200", "MXFP8")
    assert base_recipe(old).cuda_graph_scope == ("attn", "moe_router", "moe_preprocess")
    assert base_recipe(new).cuda_graph_scope == ("full_iteration",)
    assert candidate_row(old, Candidate(1, 1, 4, 4, 64, 1))["release"] == "26.02"


def test_no_candidate_runs_the_ep_overlap_where_megatron_core_refuses_it():
    """Megatron-Core asserts (TransformerConfig.__post_init__) that its EP all-to-all overlap
    runs with a pipeline only interleaved, without full recomputation and without the moe
    module recomputed: such candidates are not enumerated, and a given one is refused."""
    from sim.training.plan_space import candidates, check_given, overlap_refusal
    from sim.workload.architectures import architecture

    req = Request("Qwen3_30B_A3B", "DGX-H100", 16, 64, 4096, "BF16")
    arch = architecture("qwen3-30b-a3b")
    grid = {"pp": (1, 2), "vp": (1, 2), "tp": (1,), "cp": (1,), "mbs": (1,)}
    space = list(candidates(req, arch, 8, grid, ("moe", "layernorm")))
    on = [c for c in space if c.ep_overlap]
    assert on and any(c.pp == 2 for c in on)  # interleaved pipelines keep it
    assert all(c.pp == 1 or c.vp > 1 for c in on if c.pipeline == "1f1b")
    assert all(c.recompute == "none" for c in on if c.pipeline == "1f1b")
    assert overlap_refusal(Candidate(1, 1, 2, 2, 8, 1, True, "selective"), ("moe_act",)) == ""
    with pytest.raises(ConfigError, match=r"overlap=on: .* \(vp > 1\)"):
        check_given(req, Candidate(1, 1, 2, 1, 8, 1, True), 132, arch.layers)
    with pytest.raises(ConfigError, match="full recomputation"):
        check_given(req, Candidate(1, 1, 1, 1, 8, 1, True, "full"), 132, arch.layers)


def test_num_layers_shortens_the_model_and_keeps_its_dense_layers():
    """A proxy of DeepSeek-V3 (Megatron-LM PR #6311: 14 layers, the first 3 dense): the
    step's model has 14 layers, 11 of them MoE; fewer layers than the dense ones refused."""
    from sim.training.predict import parse_row, prepare

    row = {
        "system": "DGX-H100",
        "model": "DeepSeekV3",
        "gpus": "64",
        "precision": "BF16",
        "gbs": "256",
        "mbs": "1",
        "seq_len": "2048",
        "fsdp": "0",
        "tp": "1",
        "pp": "4",
        "cp": "1",
        "vp": "2",
        "ep": "16",
        "ga": "",
        "num_layers": "14",
        "pipeline_layout": "Ett|(tt|)*6mL",
        "mtp": "1",
    }
    p = prepare(parse_row(row, 1))
    assert p.arch.layers == 14 and p.arch.first_dense == 3
    with pytest.raises(ConfigError, match="num_layers: 3 leaves no MoE layer"):
        prepare(parse_row({**row, "num_layers": "3", "pipeline_layout": ""}, 1))


def test_hardware_queues_are_the_scripts_unless_the_grid_names_them(tmp_path: Path):
    """Each candidate runs on the queues Megatron-Bridge's scripts give it (one on Hopper at
    TP 2 without EP overlap, CUDA's 8 at TP 1 with the all-to-all) unless `--grid queues`
    names them; one queue is never faster, and best.csv carries the count it ran on."""
    from sim.training.predict import predict_rows, read_table

    grid = {**GRID, "tp": (1, 2), "pp": (1,), "vp": (1,), "mbs": (1,), "recompute": ("none",)}
    scripts = plan(REQ, grid=grid, prune=False)
    assert {(c["tp"], c["max_connections"]) for c in scripts.candidates} == {(1, 8), (2, 1)}
    named = plan(REQ, grid={**grid, "queues": (1, 32)}, prune=False, out=tmp_path / "p")
    step = {(c["tp"], c["max_connections"]): c["predicted_step_s"] for c in named.candidates}
    assert set(step) == {(tp, q) for tp in (1, 2) for q in (1, 32)}
    assert all(step[(tp, 1)] >= step[(tp, 32)] * (1 - 1e-12) for tp in (1, 2))
    row = read_table(tmp_path / "p" / "best.csv")[0]
    assert int(row["max_connections"]) == named.candidates[0]["max_connections"]
    got = predict_rows([row])["rows"][0]
    assert got["predicted_step_s"] == pytest.approx(named.candidates[0]["predicted_step_s"])
    with pytest.raises(ConfigError, match="queues 40: expected 1 to 32"):
        plan(REQ, grid={**grid, "queues": (40,)})
