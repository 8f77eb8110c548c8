"""A predicted step's sensitivity to the GPU, the host and the links
(`sim.training.sensitivity`, `moesim predict --sensitivity`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.training.predict import predict_rows
from tests.bad_inputs import PREDICT_ROW

ROOT = Path(__file__).resolve().parents[1]
# one GPU, a dense model: no collective and no host sync, so every second of the step is a
# GPU kernel's or the optimizer's (HBM-bound)
ONE_GPU = {
    **PREDICT_ROW,
    "release": "",
    "gpus": "1",
    "precision": "BF16",
    "gbs": "4",
    "seq_len": "4096",
    "tokens_per_s_per_gpu": "",
}
# dropless MoE layers of small experts at one sequence per micro-batch: the host's launches
# after the dispatcher's sync pace them (the layout of the published B200 run of 26.02, with
# 8 micro-batches per step instead of 64)
HOST_BOUND = {
    **ONE_GPU,
    "release": "26.02",
    "system": "DGX-B200",
    "model": "Qwen3_30B_A3B",
    "gpus": "8",
    "precision": "MXFP8",
    "gbs": "64",
    "ep": "8",
}


def test_a_lone_gpus_dense_step_scales_with_the_gpu_alone() -> None:
    """Degenerate case, closed form: every kernel and the optimizer divide by the speed-up,
    so the elasticity to the GPU is exactly 1 and to the host and the links exactly 0 (through
    the Python API, `sim.predict`)."""
    import sim

    row = sim.predict([ONE_GPU], sensitivity=True)["rows"][0]
    assert row["sensitivity"]["gpu"] == pytest.approx(1.0, abs=1e-9)
    assert row["sensitivity"]["host"] == 0.0
    assert row["sensitivity"]["links"] == 0.0
    assert row["bound_by"] == "gpu"


def test_a_faster_resource_never_slows_a_host_bound_moe_step() -> None:
    row = predict_rows([HOST_BOUND], sensitivity=True)["rows"][0]
    sens = row["sensitivity"]
    assert set(sens) == {"gpu", "host", "links"}
    assert all(0.0 <= v <= 1.0 + 1e-9 for v in sens.values()), sens
    # the host's launches pace it, and the all-to-all over NVLink is a part of it
    assert row["bound_by"] == "host"
    assert sens["host"] > sens["gpu"] > 0.0 and sens["links"] > 0.0


def test_without_the_flag_rows_carry_no_sensitivity() -> None:
    row = predict_rows([ONE_GPU])["rows"][0]
    assert "sensitivity" not in row and "bound_by" not in row


def test_cli_writes_the_sensitivities_in_every_output(tmp_path: Path) -> None:
    table = tmp_path / "runs.csv"
    table.write_text(",".join(ONE_GPU) + "\n" + ",".join(ONE_GPU.values()) + "\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sim.cli", "predict", str(table), "--sensitivity"]
    proc = subprocess.run(
        [*cmd, "--json", "--out", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["rows"][0]
    assert row["bound_by"] == "gpu"
    header = (out / "predictions.csv").read_text().splitlines()[0].split(",")
    assert {"bound_by", "sensitivity_gpu", "sensitivity_host", "sensitivity_links"} <= set(header)
    assert "bound by" in (out / "predictions.txt").read_text()
