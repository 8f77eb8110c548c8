"""Whole training steps (`moesim predict`): schedules, closed forms, bytes, FLOPs, bad rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.core.errors import ConfigError
from sim.engine.engine import simulate
from sim.hardware.costs import CostModel
from sim.hardware.topology import Topology
from sim.training.layout import Layout
from sim.training.pipeline import Phase, StagePrograms, schedule, step_graph
from sim.training.predict import parse_row, predict_rows
from sim.workload.architectures import architecture, architectures
from tests.bad_inputs import PREDICT_ROW

ROW = PREDICT_ROW  # a Llama 3 8B run on one DGX H100 (fast)


@pytest.mark.parametrize("pp,vp,micro", [(1, 1, 3), (4, 1, 8), (4, 2, 8), (3, 3, 6), (4, 2, 6)])
def test_every_stage_runs_every_pass_once_forward_first(pp: int, vp: int, micro: int) -> None:
    for s in range(pp):
        order = schedule(pp, vp, micro, s)
        want = {(k, m, c) for k in "FB" for m in range(micro) for c in range(vp)}
        assert sorted(order) == sorted(want)
        pos = {p: i for i, p in enumerate(order)}
        assert all(pos[("F", m, c)] < pos[("B", m, c)] for m in range(micro) for c in range(vp))


def test_plain_1f1b_warms_up_with_pp_minus_stage_minus_one_forwards() -> None:
    order = schedule(4, 1, 8, 1)
    assert [k for k, _, _ in order[:3]] == ["F", "F", "F"]  # 2 warm-up forwards, then 1F1B
    assert order[3][0] == "B"


def _uniform(pp: int, vp: int, tf: float, tb: float) -> list[StagePrograms]:
    one = lambda t: [Phase("compute", t, "all")]  # noqa: E731
    return [
        StagePrograms([one(tf) for _ in range(vp)], [one(tb) for _ in range(vp)]) for _ in range(pp)
    ]


@pytest.mark.parametrize("pp,vp,micro", [(2, 1, 4), (4, 1, 8), (4, 2, 8), (4, 3, 12), (8, 5, 16)])
def test_interleaved_bubble_is_pp_minus_one_over_vp_times_ga(pp: int, vp: int, micro: int) -> None:
    """With free communication a step is the ideal GA x (tf + tb) plus the bubble
    (PP - 1) / (VP x GA) of it (Narayanan et al., SC'21, Sec. 2.2)."""
    tf, tb = 1e-3 / vp, 2e-3 / vp  # a stage's forward and backward per micro-batch, per chunk
    topo = Topology.load("flat-switch", nodes=pp)
    g = step_graph(
        _uniform(pp, vp, tf, tb), list(range(pp)), topo.world_size, micro, vp, 0.0, overlap=False
    )
    span = simulate(g, topo, CostModel.build(topo, {"network": "collective"})).makespan
    ideal = micro * vp * (tf + tb)
    assert span == pytest.approx(ideal * (1 + (pp - 1) / (vp * micro)), rel=1e-9)


def test_groups_follow_megatron_rank_order() -> None:
    lay = Layout(gpus=64, tp=4, pp=8, ep=1, gbs=128, seq=8192, vp=5)
    assert lay.dp == 2 and lay.ga == 64
    assert lay.groups("tp")[0] == [0, 1, 2, 3]
    assert lay.groups("dp")[0] == [0, 4]
    assert lay.groups("pp")[0] == [0, 8, 16, 24, 32, 40, 48, 56]
    moe = Layout(gpus=256, tp=2, pp=8, ep=32, gbs=2048, seq=4096)
    assert moe.edp == 1 and moe.groups("ep")[0] == list(range(32))
    assert all(len(g) == 32 for g in moe.groups("ep"))


class _Recorder:
    """A collective timer that records what it is asked for and answers 0 s."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.simulations = 0

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        self.calls.append((kind, dim, nbytes))
        return 0.0

    def place(self, rank: int) -> int:
        return rank


def test_distributed_optimizer_traffic_is_the_formula_bytes() -> None:
    """Per layer, the gradient reduce-scatter takes the layer's gradient buffer (weights on
    the GPU x bytes per gradient) and the parameter all-gather a 1/DP shard of its weights."""
    from sim.training.kernels import GpuKernels
    from sim.training.ops import layer_work
    from sim.training.precision import PRECISIONS
    from sim.training.recipe import Recipe
    from sim.training.step import StepModel

    a = architecture("llama3-8b")
    lay = Layout(gpus=16, tp=2, pp=1, gbs=32, seq=4096)
    topo = Topology.load("dgx-h100", nodes=2)
    rec = _Recorder()
    r = Recipe(grad_reduce_bytes=2)
    m = StepModel(a, lay, PRECISIONS["BF16"], r, GpuKernels.from_gpu(topo.gpu, "t"), rec)  # type: ignore[arg-type]
    m.dp_collectives(layer_work(a, lay, PRECISIONS["BF16"], 0))
    weights = (a.attention_params() + a.mlp_params(a.ffn)) / lay.tp
    assert ("reduce_scatter", "dpcp", pytest.approx(2 * weights)) in rec.calls
    assert ("all_gather", "dpcp", pytest.approx(2 * weights / lay.dp)) in rec.calls


@pytest.mark.parametrize(
    "name,seq", [("llama3-8b", 8192), ("llama3-70b", 8192), ("llama3.1-405b", 8192)]
)
def test_model_flops_are_megatrons_formula(name: str, seq: int) -> None:
    """Megatron-LM `num_floating_point_operations` for a dense GQA SwiGLU model, per token:
    12 L h^2 [(1 + kv/heads + seq/(2h)) q/h + 1.5 ffn/h + V/(2 L h)]."""
    a = architecture(name)
    h, L, q = a.hidden, a.layers, a.heads * a.qk_dim
    per_token = (
        12
        * L
        * h
        * h
        * (
            (1 + a.kv_heads / a.heads + seq / (2 * h)) * q / h
            + 1.5 * a.ffn / h
            + a.vocab / (2 * L * h)
        )
    )
    assert a.model_flops_per_token(seq) == pytest.approx(per_token, rel=1e-12)


def test_every_architecture_has_a_source_and_sane_sizes() -> None:
    for name, a in architectures().items():
        assert "huggingface.co" in a.source, name
        assert a.total_params() > 1e9
    assert architecture("deepseek-v3").total_params() == pytest.approx(671e9, rel=0.01)
    assert architecture("qwen3-235b-a22b").total_params() == pytest.approx(235e9, rel=0.01)


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"system": "DGX-Z9"}, "row 1 (DGX-Z9 LLAMA3_8B): system: unknown system 'DGX-Z9'"),
        ({"model": "GPT5"}, "model: unknown model 'GPT5'"),
        ({"tp": "3"}, "tp x pp x cp = 3 does not divide the 8 GPUs"),
        ({"ga": "7"}, "ga: 7 but gbs / (mbs x dp) = 16 / (1 x 8) = 2"),
        ({"gbs": "12"}, "gbs: 12 is not a multiple of mbs x dp = 1 x 8"),
        ({"precision": "FP3"}, "precision: unknown 'FP3'"),
        ({"mbs": "-1"}, "mbs: expected an integer >= 1, got '-1'"),
        ({"pp": "abc"}, "pp: expected an integer, got 'abc'"),
    ],
)
def test_bad_rows_get_one_line_reasons(change: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_row({**ROW, **change}, 1)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_row_that_cannot_run_keeps_its_columns_and_a_reason() -> None:
    res = predict_rows([{**ROW, "ep": "2"}, {**ROW, "model": "GPT5"}])
    reasons = [r["reason"] for r in res["rows"]]
    assert (
        reasons[0]
        == "row 1 (DGX-H100 LLAMA3_8B FP8-CS, 8 GPUs): ep: 2 for the dense model LLAMA3_8B"
    )
    assert reasons[1].startswith("row 2 (DGX-H100 GPT5): model: unknown model 'GPT5'")
    assert all(r["system"] == "DGX-H100" for r in res["rows"])
    assert res["mape"] == {}


def test_a_row_is_predicted_with_every_output_field() -> None:
    res = predict_rows([ROW])
    r = res["rows"][0]
    assert r["predicted_step_s"] > 0 and r["peak_memory_bytes"] > 0
    assert r["predicted_tokens_per_s_per_gpu"] == pytest.approx(
        16 * 8192 / r["predicted_step_s"] / 8
    )
    flops = architecture("llama3-8b").model_flops_per_token(8192)
    assert r["predicted_tflops_per_gpu"] == pytest.approx(
        r["predicted_tokens_per_s_per_gpu"] * flops / 1e12
    )
    assert r["error"] == pytest.approx(r["predicted_tokens_per_s_per_gpu"] / 14451 - 1)
    assert set(res["mape"]) == {"overall", "DGX-H100"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_json_and_output_set(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    cols = list(ROW)
    bad = {**ROW, "tp": "3"}
    table.write_text(
        ",".join(cols) + "\n" + "\n".join(",".join(r[c] for c in cols) for r in (ROW, bad)) + "\n"
    )
    p = _cli("predict", str(table), "--json", "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["rows"]) == 2 and "reason" in out["rows"][1]
    assert out["rows"][0]["predicted_tokens_per_s_per_gpu"] > 0
    files = {f.name for f in (tmp_path / "out").iterdir()}
    assert {"predictions.csv", "predictions.json", "predictions.html", "manifest.json"} <= files


def test_cli_refuses_a_table_without_its_columns(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("system,model\nDGX-H100,LLAMA3_8B\n")
    p = _cli("predict", str(table))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "missing column(s) gpus, precision" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_rows_on_worker_processes_are_the_rows_in_order() -> None:
    rows = [ROW, {**ROW, "model": "GPT5"}, {**ROW, "gbs": "32"}]
    one, two = predict_rows(rows), predict_rows(rows, workers=2)
    keys = ("predicted_step_s", "peak_memory_bytes", "reason")
    assert [[r.get(k) for k in keys] for r in one["rows"]] == [
        [r.get(k) for k in keys] for r in two["rows"]
    ]
    assert one["mape"] == two["mape"]


def test_measured_kernels_replace_the_presets_for_their_system(tmp_path: Path) -> None:
    """A GPU suite's proposed_kernels.yaml (`--kernels SYSTEM=FILE`) is used for that system's
    rows: halving the GEMM shares slows the step; a bad file is one line, exit 2."""
    from sim.training.predict import load_kernels

    f = tmp_path / "k.yaml"
    f.write_text("# measured\nkernels:\n  gemm: {bf16: 0.4, fp8: 0.37}\n")
    base = predict_rows([ROW])["rows"][0]["predicted_step_s"]
    slow = predict_rows([ROW], kernels=dict([load_kernels(f"DGX-H100={f}")]))
    assert slow["rows"][0]["predicted_step_s"] > base * 1.3
    on_workers = predict_rows([ROW, ROW], workers=2, kernels=dict([load_kernels(f"DGX-H100={f}")]))
    assert [r["predicted_step_s"] for r in on_workers["rows"]] == [
        slow["rows"][0]["predicted_step_s"]
    ] * 2
    other = predict_rows([ROW], kernels=dict([load_kernels(f"DGX-B200={f}")]))
    assert other["rows"][0]["predicted_step_s"] == pytest.approx(base)
    f.write_text("kernels:\n  attention_fwd: 1.5\n")
    p = _cli("predict", str(tmp_path / "t.csv"), "--kernels", f"DGX-H100={f}")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "attention_fwd" in p.stderr


class _Dispatchers:
    """A collective timer answering 1 s for NCCL's collectives and 2 s for DeepEP's kernels,
    with `per_domain` GPUs of the job on each NVLink domain."""

    simulations = 0

    def __init__(self, per_domain: int) -> None:
        self.per_domain = per_domain

    def seconds(self, kind: str, dim: str, nbytes: float, algo: str | None = None) -> float:
        return 1.0

    def deepep(self, nbytes: float, top_k: int, experts: int, combine: bool, sms: int) -> float:
        return 2.0

    def place(self, rank: int) -> int:
        return rank


@pytest.mark.parametrize(
    "dispatcher,ep,etp,per_domain,expected",
    [
        ("hybridep", 16, 1, 8, 2.0),  # EP 16 over two domains: DeepEP's kernels
        ("hybridep", 16, 1, 16, 2.0),  # one domain: the same kernels, NVLink only
        ("hybridep", 8, 2, 8, 2.0),
        ("deepep", 16, 1, 16, 2.0),
        ("deepep", 8, 1, 8, 2.0),
        ("alltoall", 16, 1, 8, 1.0),  # NCCL's all-to-all, in a domain or across
        ("alltoall", 8, 1, 8, 1.0),
        ("allgather", 8, 1, 8, 1.0),
    ],
)
def test_flex_dispatchers_cost_as_deepeps_kernels_in_and_across_nvlink_domains(
    dispatcher: str, ep: int, etp: int, per_domain: int, expected: float
) -> None:
    from sim.training.kernels import GpuKernels
    from sim.training.ops import PRECISIONS, Comm
    from sim.training.recipe import Recipe
    from sim.training.step import StepModel

    topo = Topology.load("dgx-h100", nodes=2)
    lay = Layout(gpus=16, ep=ep, etp=etp, gbs=16, seq=4096)
    m = StepModel(
        architecture("qwen3-30b-a3b"),
        lay,
        PRECISIONS["BF16"],
        Recipe(dispatcher=dispatcher),
        GpuKernels.from_gpu(topo.gpu, "t"),
        _Dispatchers(per_domain),
    )
    assert m._ep_seconds(Comm("dispatch", "all_to_all", "ep", 1e6, "permute")) == expected
