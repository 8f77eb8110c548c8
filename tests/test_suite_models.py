"""benchmarks/suite_models.py on a tiny synthetic GPU-suite folder (a few rows written here, the
real hgx-h200 preset): rows measured at exactly what a model says score 0, whatever the
preset's figures; a CPU folder still gets a report; a folder it cannot score is one line and
exit 2. Nothing about the real runs' fit is asserted."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import suite_models as S
from benchmarks.suite_models_score import read_kernels, score_kernels, score_tiles, tile_rows
from sim.hardware.costs.gemm import GemmModel
from sim.hardware.topology import Topology
from sim.training.kernels import GpuKernels

PRESET = "topologies/hgx-h200.yaml"
COLUMNS = ["part", "name", "impl", "layout", "shape", "dtype", "flops", "bytes", "median_s"]
COLUMNS += ["status", "note"]
E, M, N, K = 8, 2048, 4096, 7168  # a grouped case: 8 experts of 2048 tokens
B_MEM = 2.0e9  # bytes of a memory-bound row (far above the launch floor)


@pytest.fixture(scope="module")
def models() -> tuple[GemmModel, GpuKernels]:
    topo = Topology.load(S.ROOT / PRESET, nodes=1)
    gemm = GemmModel.from_gpu(topo.gpu)
    assert gemm is not None
    return gemm, GpuKernels.from_gpu(topo.gpu, PRESET)


def _write(folder: Path, part: str, rows: list[dict]) -> None:
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    with open(folder / "kernels" / f"{part}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({"part": part, "status": "ok", "note": "", **r})


def _suite(folder: Path, models: tuple[GemmModel, GpuKernels], env: dict) -> Path:
    gemm, gpu = models
    (folder / "env.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "env.json").write_text(json.dumps(env))
    # measured = the tile model's own prediction: a dgrad row (layout "nt") and a loop of E
    dgrad = gemm.seconds("bf16", 1, 8192, 8192, 7168, "nt")
    _write(
        folder,
        "gemm",
        [
            {
                "name": "dense fc1",
                "impl": "matmul",
                "layout": "dgrad",
                "shape": "m=8192 n=8192 k=7168",
                "dtype": "bf16",
                "median_s": repr(dgrad),
            }
        ],
    )
    one = gemm.seconds("bf16", 1, M, N, K, "nn")
    _write(
        folder,
        "grouped",
        [
            {
                "name": "moe fc1",
                "impl": "loop",
                "layout": "fwd",
                "shape": f"E={E} m={M} n={N} k={K}",
                "dtype": "bf16",
                "median_s": repr(E * one),
            }
        ],
    )
    # measured = what the training model charges: B / (mem_bw x memory_bound) + one kernel's
    # floor, and the attention's FLOPs at attention_fwd of the bf16 peak carried to the row's
    # shape by the preset's attention_shape (+ the floor)
    mem = B_MEM / (gpu.mem_bw * gpu.memory_bound) + gpu.kernel_s
    _write(
        folder,
        "memory",
        [
            {
                "name": "stream",
                "impl": "torch eager",
                "shape": "T=1 h=1",
                "dtype": "bf16",
                "bytes": repr(B_MEM),
                "median_s": repr(mem),
                "note": "kernels: 1",
            }
        ],
    )
    b, L, h, d = 2, 4096, 64, 128
    flops = b * L * L * h * 2 * d  # causal: half of 4 L^2 d per head
    shape = gpu.attention_shape.factor(L, d, False) if gpu.attention_shape else 1.0
    att = flops / (gpu.peak["bf16"] * gpu.attention_fwd * shape) + gpu.kernel_s
    _write(
        folder,
        "attention",
        [
            {
                "name": "gqa",
                "impl": "cudnn",
                "layout": "fwd",
                "shape": f"B={b} L={L} heads={h} kv=8 d_qk={d} d_v={d}",
                "dtype": "bf16",
                "flops": repr(flops),
                "median_s": repr(att),
            }
        ],
    )
    return folder


GPU_ENV = {"device": "NVIDIA H200", "device_type": "cuda", "preset": {"file": PRESET}}


def test_rows_at_the_models_own_times_score_zero(tmp_path, models):
    folder = _suite(tmp_path / "suite", models, GPU_ENV)
    k = read_kernels(folder)
    scored, scores = score_tiles(models[0], tile_rows(k))
    assert set(scored["layout"]) == {"nt", "nn"}  # dgrad -> nt; the loop's fwd -> nn
    assert scored["error"].abs().max() < 1e-9
    assert scores["grouped loop"]["rows"] == 1 and scores["training shapes"]["rows"] == 1
    charged, skipped = score_kernels(models[1], k)
    assert not skipped
    by = charged.set_index("group")
    for part in ("memory", "attention (fastest)", "attention cudnn"):
        assert abs(by.loc[part, "error"]) < 1e-9, part
    # the implied share of an exact row is the preset's own
    assert by.loc["memory", "implied_share"] == pytest.approx(models[1].memory_bound)
    assert by.loc["attention cudnn", "implied_share"] == pytest.approx(models[1].attention_fwd)


def test_report_names_the_device_and_source(tmp_path, models):
    folder = _suite(tmp_path / "suite", models, GPU_ENV)
    out = tmp_path / "out"
    assert S.main([str(folder), "--out", str(out)]) == 0
    md = (out / "suite_models_h200.md").read_text()
    assert "NVIDIA H200" in md and str(folder) in md and PRESET in md
    data = json.loads((out / "suite_models_h200.json").read_text())
    assert data["kernel_model"]["parts"]["memory"]["mape_pct"] < 1e-6


def test_a_cpu_folder_gets_a_report_and_no_preset_is_exit_2(tmp_path, models, capsys):
    cpu = {"device": "cpu (x86)", "device_type": "cpu", "dry_run": True}
    folder = _suite(
        tmp_path / "cpu", models, {**cpu, "preset": {"file": "topologies/localhost-cpu.yaml"}}
    )
    out = tmp_path / "out"
    assert S.main([str(folder), "--out", str(out)]) == 0
    md = (out / "suite_models_cpu.md").read_text()
    assert "The device is a CPU" in md and "Not scored" in md
    bare = _suite(tmp_path / "bare", models, cpu)
    capsys.readouterr()
    assert S.main([str(bare), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--preset" in err
