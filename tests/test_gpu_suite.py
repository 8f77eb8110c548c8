"""benchmarks/gpu_suite.py cannot rot between lent GPUs: its dry run (CPU, gloo, tiny shapes)
goes through every part's code path and writes the whole output set; a budget drops parts in
the priority order `--help` lists; the parts' expected seconds on an H100 add up to at most 8
minutes; bad options are one line and exit 2; the clock sampler says why a CPU gave it nothing,
reads NVML or nvidia-smi (both faked here) and stops at a part's end or allowance, and its
per-part summary is the closed form. No timings are asserted (issue 27)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from benchmarks.gpu_suite_parts import clocks
from benchmarks.gpu_suite_parts.common import Ctx

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
    assert {
        "calibrate",
        "validate",
        "validate_big",
        "attention",
        "grouped",
        "replay",
        "block",
    } <= set(names)
    assert names.index("validate_big") == names.index("validate") + 1
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
        "twin/big/layer.yaml",
        "twin/big/calibration.yaml",
        "twin/big/calibration.csv",
        "twin/validate_big/validation.json",
        "twin/validate_big.csv",
        "clocks.csv",
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


def test_validate_big_ran_on_its_own_calibration(dry):
    status = {r["name"]: r for r in _parts_csv(dry)}["validate_big"]
    assert status["status"] == "ran", status
    with open(dry / "twin" / "validate_big.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["graph"] for r in rows} == {"sequential fwd", "sequential fwd+bwd"}
    assert all(float(r["measured_s"]) > 0 and float(r["simulated_s"]) > 0 for r in rows)
    summary = json.loads((dry / "summary.json").read_text())
    assert summary["validate_big"]["mape_pct"] is not None
    assert "validation of the larger bf16 layer" in (dry / "summary.md").read_text()
    # its own layer and calibration: not the layer set's shapes, a calibrate of its own layer
    big = yaml.safe_load((dry / "twin" / "big" / "layer.yaml").read_text())["model"]
    small = yaml.safe_load((dry / "twin" / "layer.yaml").read_text())["model"]
    assert (big["model_dim"], big["hidden_dim"]) != (small["model_dim"], small["hidden_dim"])
    log = (dry / "twin" / "big" / "calibrate.log").read_text()
    assert "--shapes-from" in log and "twin/big/layer.yaml" in log


def test_clock_sampler_says_why_a_cpu_gave_it_nothing(dry):
    with open(dry / "clocks.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == clocks.COLUMNS and not list(reader)
    c = json.loads((dry / "summary.json").read_text())["clocks"]
    assert c["samples"] == 0 and not c["parts"] and "CPU" in c["note"]
    told = [ln for ln in (dry / "suite.log").read_text().splitlines() if "clocks " in ln]
    assert len(told) == 1 and "not sampled" in told[0], told  # one line, once
    assert f"clocks {c['note']}" in (dry / "summary.md").read_text()


def test_clock_summary_is_min_median_max_per_part():
    def r(part, sm, power, util="", throttle=""):
        return dict(
            time_s=0.0,
            part=part,
            sm_mhz=sm,
            mem_mhz=2619,
            power_w=power,
            temp_c=50,
            util_pct=util,
            throttle=throttle,
        )

    rows = [
        r("gemm", 1980, 700, 100, "0x4"),
        r("gemm", 1755, 650, 100, "0x4"),
        r("gemm", 1830, 690, 100, "0x0"),
        r("gemm", 1980, 700, 100, ""),
        r("gemm", 1500, 400, 0, "0x1"),
        r("block", 1200, ""),
        r("block", 1400, 300),
    ]
    s = clocks.summarise(rows)
    assert list(s) == ["gemm", "block"]  # in the order the parts ran
    g, b = s["gemm"], s["block"]
    assert (g["samples"], g["sm_mhz_min"], g["sm_mhz_median"], g["sm_mhz_max"]) == (
        5,
        1500,
        1830,
        1980,
    )
    assert g["power_w_median"] == 690 and g["power_w_max"] == 700
    assert g["sm_mhz_median_busy"] == (1830 + 1980) / 2 and g["busy_samples"] == 4
    assert g["reasons"] == {"power cap": 0.5}  # 2 of the 4 samples with a mask
    assert (b["sm_mhz_min"], b["sm_mhz_median"], b["sm_mhz_max"]) == (1200, 1300, 1400)
    assert b["power_w_median"] == 300 and b["sm_mhz_median_busy"] is None and not b["reasons"]
    assert clocks.summarise([]) == {}


class _FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1980 if which == 1 else 2619

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_000

    def nvmlDeviceGetTemperature(self, h, which):
        return 55

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=100)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x4


def _sample(tmp_path, sampler):
    """gemm until stopped; then block, whose allowance ends before it does."""
    ctx = Ctx(dry=False, out=tmp_path, preset={}, device=SimpleNamespace(type="cuda"))
    sampler.start(ctx, "gemm")
    time.sleep(0.45)
    sampler.stop()
    ctx.deadline = time.monotonic() + 0.3
    sampler.start(ctx, "block")
    time.sleep(0.9)  # past the allowance: its sampling has ended without a stop()
    n = len(sampler.rows)
    time.sleep(0.3)
    assert len(sampler.rows) == n
    sampler.stop()
    sampler.close()
    return clocks.summarise(sampler.rows)


def test_clock_sampler_reads_nvml_and_stops_at_the_allowance(tmp_path, monkeypatch):
    nv = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = clocks.Sampler(time.monotonic(), period_s=0.05)
    s = _sample(tmp_path, sampler)
    assert sampler.source == "nvml" and not sampler.why and nv.shut
    assert set(s) == {"gemm", "block"} and s["gemm"]["samples"] >= 3
    assert s["gemm"]["sm_mhz_median"] == 1980 and s["gemm"]["power_w_median"] == 650
    assert s["block"]["reasons"] == {"power cap": 1.0}


def test_clock_sampler_falls_back_to_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: its import fails
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\nwhile true; do echo '1755, 2619, [N/A], 61, 99'; sleep 0.05; done\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    sampler = clocks.Sampler(time.monotonic(), period_s=0.05)
    s = _sample(tmp_path, sampler)
    assert sampler.source.startswith("nvidia-smi (NVML: ") and not sampler.why
    assert s["gemm"]["samples"] >= 3 and s["block"]["sm_mhz_max"] == 1755
    assert s["gemm"]["power_w_median"] is None and s["gemm"]["temp_c_max"] == 61


def test_the_grouped_share_is_counted_against_gemm_bf16s_run(tmp_path):
    """The step model multiplies grouped_gemm by gemm.bf16's rate, so the proposal counts
    each grouped case against the large GEMM of gemm.csv, not the grouped part's own reference
    run of the same shape (on the H200 the two ran at 781.8 and 739.8 TFLOP/s)."""
    from benchmarks.gpu_suite_parts.common import Ctx
    from benchmarks.gpu_suite_parts.summary import proposed

    big = dict(part="gemm", name="square 8192^3", layout="fwd", dtype="bf16", status="ok")
    gemm = [{**big, "flops": 1.0, "tflops": 800.0, "peak_share": 0.8, "shape": "8192^3"}]
    grouped = [
        dict(name="reference", status="ok", tflops=760.0),
        dict(
            name="fc1", layout="fwd", impl="bmm", tokens_per_expert=4096, tflops=760.0, status="ok"
        ),
        dict(
            name="fc1", layout="fwd", impl="loop", tokens_per_expert=4096, tflops=700.0, status="ok"
        ),
        dict(
            name="fc2", layout="fwd", impl="bmm", tokens_per_expert=512, tflops=100.0, status="ok"
        ),
    ]
    ctx = Ctx(dry=False, out=tmp_path, preset={"peak_flops": {"bf16": 1e15}})
    ctx.shared.update(gemm=gemm, grouped=grouped)
    value, why = proposed(ctx, "here")["grouped_gemm"]
    assert value == pytest.approx(760.0 / 800.0)  # the best impl of the one case >= 2048 tokens
    assert "800 TFLOP/s" in why


def test_gemm_shares_are_proposed_over_the_sm_waves_they_fill(tmp_path):
    """The step model multiplies gemm[dtype] by the share of SM waves a GEMM's tiles fill
    (sim.training.kernels.wave_share), so 8192^3 on 132 SMs (2,048 tiles of 128 x 256 in 16
    waves, the last one 52% full) proposes its share over 2048 / 2112."""
    from benchmarks.gpu_suite_parts import summary
    from benchmarks.gpu_suite_parts.common import Ctx
    from sim.training.kernels import TILE

    assert summary.TILE == TILE
    shape = "m=8192 n=8192 k=8192"
    big = dict(part="gemm", name="square 8192^3", layout="fwd", dtype="bf16", status="ok")
    gemm = [{**big, "flops": 1.0, "tflops": 730.0, "peak_share": 0.73, "shape": shape}]
    ref = dict(name="reference", status="ok", tflops=730.0, shape=shape)
    # 8 experts of 2048 x 4096: 16 x 16 x 8 = 2,048 tiles, the same waves as 8192^3
    fc1 = dict(name="fc1", layout="fwd", impl="bmm", tokens_per_expert=2048, status="ok")
    grouped = [ref, {**fc1, "tflops": 700.0, "shape": "E=8 m=2048 n=4096 k=7168"}]
    ctx = Ctx(dry=False, out=tmp_path, preset={"peak_flops": {"bf16": 1e15}})
    ctx.shared.update(gemm=gemm, grouped=grouped, env={"sms": 132})
    props = summary.proposed(ctx, "here")
    assert props["gemm.bf16"][0] == pytest.approx(0.73 * 2112 / 2048)
    assert props["grouped_gemm"][0] == pytest.approx(700.0 / 730.0)  # the same waves
    # 3 experts of 1024 x 2048: 3 x 8 x 8 = 192 tiles in 2 waves of 132
    assert summary.wave("E=3 m=1024 n=2048 k=1", 132) == pytest.approx(192 / 264)
    ctx.shared["env"] = {}  # no SM count: the raw share
    assert summary.proposed(ctx, "here")["gemm.bf16"][0] == pytest.approx(0.73)
