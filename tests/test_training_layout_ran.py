"""Rows whose printed layout cannot be what ran (`ran_layout` in recipes.yaml) are predicted
at their release's recipe layout, say so, and keep their printed columns; `--as-printed`
takes every row as printed."""

from __future__ import annotations

import json
import subprocess
import sys

from sim.training.predict import as_ran, predict_rows
from sim.training.recipe import layout_ran

# the shared table's row 38 (25.11 DGX-H100 Qwen3-30B-A3B FP8-CS), as printed
ROW = {
    "release": "25.11",
    "system": "DGX-H100",
    "model": "Qwen3_30B_A3B",
    "variant": "",
    "gpus": "16",
    "precision": "FP8-CS",
    "gbs": "512",
    "mbs": "2",
    "seq_len": "4096",
    "fsdp": "0",
    "tp": "1",
    "pp": "2",
    "cp": "1",
    "vp": "24",
    "ep": "8",
    "ga": "32",
    "tokens_per_s_per_gpu": "5275",
}


def test_only_the_rows_own_release_records_a_ran_layout() -> None:
    ran, why = layout_ran("Qwen3_30B_A3B", "DGX-H100", "FP8-CS", "25.11")
    assert ran == {"vp": 12, "mbs": 1} and "25.09" in why
    assert layout_ran("GPT_OSS_120B", "DGX-B200", "BF16", "25.11")[0] == {"ep": 64}
    # another release of the same model and system: nothing (its own columns are what ran)
    assert layout_ran("Qwen3_30B_A3B", "DGX-H100", "FP8", "26.02") == ({}, "")
    assert layout_ran("Qwen3_30B_A3B", "DGX-H100", "FP8-CS", "") == ({}, "")
    assert as_ran({**ROW, "release": "25.09"}) == {**ROW, "release": "25.09"}


def test_the_row_runs_its_recipes_layout_and_keeps_its_printed_columns() -> None:
    ran = as_ran(ROW)
    assert (ran["vp"], ran["mbs"], ran["ga"]) == ("12", "1", "")  # GA follows the batch
    assert ran["layout_ran"] == "vp 24 -> 12, mbs 2 -> 1"
    got, printed = predict_rows([ROW])["rows"][0], predict_rows([ROW], as_printed=True)["rows"][0]
    assert (got["vp"], got["mbs"], got["ga"]) == ("24", "2", "32")
    assert got["layout_ran"] == ran["layout_ran"] and got["layout_why"]
    assert "layout_ran" not in printed
    # one micro-batch of 4,096 tokens over twice the virtual stages: another step than printed
    assert got["predicted_step_s"] != printed["predicted_step_s"]
    assert got["error"] == got["predicted_tokens_per_s_per_gpu"] / 5275 - 1


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_says_which_layout_ran(tmp_path) -> None:
    table = tmp_path / "t.csv"
    table.write_text(",".join(ROW) + "\n" + ",".join(ROW.values()) + "\n")
    p = _cli("predict", str(table))
    assert p.returncode == 0, p.stderr
    assert "predicted at the layout its recipe ran, vp 24 -> 12, mbs 2 -> 1" in p.stdout
    p = _cli("predict", str(table), "--as-printed", "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)["rows"][0]
    assert "layout_ran" not in row and row["vp"] == "24"
