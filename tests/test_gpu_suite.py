"""benchmarks/gpu_suite.py cannot rot between lent GPUs: its dry run (CPU, gloo, tiny shapes)
goes through every part's code path and writes the whole output set; a budget drops parts in
the priority order `--help` lists; the parts' expected seconds on an H100 add up to at most 8
minutes; bad options are one line and exit 2. No timings are asserted (issue 27)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the suite's kernels and the executor need torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_suite.py"
# on a busy 2-core machine the dry run takes about a minute; this only stops a hang
TIMEOUT_S = 600
KERNEL_COLUMNS = {
    "part",
    "name",
    "impl",
    "layout",
    "shape",
    "dtype",
    "flops",
    "bytes",
    "median_s",
    "repeats",
    "tflops",
    "gbps",
    "peak_of",
    "peak",
    "peak_share",
    "status",
    "note",
}
KERNEL_FILES = ("attention", "grouped", "gemm", "fp8", "memory", "copy", "launch")


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _help_parts() -> list[tuple[str, int]]:
    """(part, expected seconds) in the order `--help` lists them."""
    out = _run("--help").stdout
    rows = re.findall(r"^\s+(\d+)\s+(\w+)\s+(\w+)\s+(\d+)\s+\S", out, flags=re.M)
    return [(name, int(sec)) for _, name, _, sec in rows]


def _parts_csv(out: Path) -> list[dict[str, str]]:
    with open(out / "parts.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def dry(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("suite") / "out"
    r = _run("--dry-run", "--out", str(out), timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_help_lists_every_part_within_eight_minutes():
    parts = _help_parts()
    names = [n for n, _ in parts]
    assert names[0] == "env" and len(names) == len(set(names)) >= 10
    assert {"calibrate", "validate", "attention", "grouped", "replay", "block"} <= set(names)
    assert all(s > 0 for _, s in parts)
    assert sum(s for _, s in parts) <= 480


def test_dry_run_writes_the_whole_set(dry):
    for name in (
        "summary.md",
        "summary.json",
        "parts.csv",
        "env.json",
        "proposed_kernels.yaml",
        "manifest.json",
        "suite.log",
        "twin/calibration.yaml",
        "twin/validate/validation.json",
        "twin/validate.csv",
        "twin/block.csv",
        "replay/kineto/rank0.json.gz",
        "replay/replay.csv",
        *(f"kernels/{k}.csv" for k in KERNEL_FILES),
    ):
        assert (dry / name).is_file(), name
    manifest = json.loads((dry / "manifest.json").read_text())
    assert manifest["kind"] == "gpu-suite"
    for name, entry in manifest["files"].items():  # the set is whole: every file listed is there
        assert (dry / name).stat().st_size == entry["bytes"], name
    assert not [p for p in dry.iterdir() if p.name.startswith(".")]  # no staging left behind
    summary = (dry / "summary.md").read_text()
    assert "# GPU suite: cpu" in summary and "Dry run" in summary
    assert "## Proposed gpu.kernels" in summary


def test_every_part_ran_or_was_skipped_with_a_reason(dry):
    rows = _parts_csv(dry)
    assert [r["name"] for r in rows] == [n for n, _ in _help_parts()]
    for r in rows:
        assert r["status"] in ("ran", "skipped"), r
        if r["status"] == "skipped":
            assert r["reason"], r
    summary = json.loads((dry / "summary.json").read_text())
    assert summary["dry_run"] is True and summary["device"].startswith("cpu")
    assert {p["name"]: p["status"] for p in summary["parts"]} == {
        r["name"]: r["status"] for r in rows
    }
    # the twin's numbers reach the summary (values are a CPU's: not checked)
    assert summary["validate"]["mape_pct"] is not None
    assert summary["block"]["simulated_s"] > 0
    assert summary["replay"]["replayed_s"] > 0


def test_kernel_csvs_have_the_columns(dry):
    for k in KERNEL_FILES:
        with open(dry / "kernels" / f"{k}.csv", newline="") as f:
            reader = csv.DictReader(f)
            assert set(reader.fieldnames or []) >= KERNEL_COLUMNS, k
            rows = list(reader)
        assert rows, k
        for r in rows:
            assert r["part"] == k and r["status"] in ("ok", "skipped", "cut"), r
            if r["status"] == "ok":
                assert float(r["median_s"]) > 0, r
                assert r["tflops"] or r["gbps"] or k == "launch", r
            else:
                assert r["note"], r  # a skipped row says why
    with open(dry / "twin" / "validate.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"graph", "measured_s", "simulated_s", "error_pct"} <= set(rows[0])


def test_budget_drops_parts_in_priority_order(tmp_path):
    order = [n for n, _ in _help_parts()]
    out = tmp_path / "b1"
    r = _run("--dry-run", "--budget", "1", "--out", str(out), timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = _parts_csv(out)
    assert [x["name"] for x in rows] == order
    assert rows[0]["status"] == "ran"  # env always runs: it names the device
    for x in rows[1:]:
        assert x["status"] == "dropped" and "budget" in x["reason"], x
    # in between, what is dropped is always the least valuable end of the list
    for budget in (30, 100, 200, 250, 300, 400):
        plan = _run("--plan", "--budget", str(budget)).stdout
        states = re.findall(r"^\s+(run|drop)\s+(\w+)", plan, flags=re.M)
        assert [n for _, n in states] == order
        kept = [s == "run" for s, _ in states]
        assert kept == sorted(kept, reverse=True), (budget, states)  # runs, then drops


@pytest.mark.parametrize(
    "args",
    [("--budget", "-1"), ("--parts", "nosuch"), ("--budget", "abc"), ("--dry-run",)],
)
def test_bad_options_are_one_line_and_exit_2(args, tmp_path):
    extra = () if "--dry-run" in args else ("--out", str(tmp_path / "x"))
    r = _run(*args, *extra)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()
