"""The calibrate -> simulate -> validate loop on this machine (gloo, 2 ranks). CI checks that
the loop works and gives sane numbers, never a timing nor a fit quality (a busy machine may
fit a GEMM with r2 ~ 0: that is a warning in the file, not a failure); the accuracy itself is
a recorded benchmark (reports/validation-localhost-gloo/). One calibration serves every test
here: measuring is the slow part."""

from __future__ import annotations

import json

import pytest
import yaml

torch = pytest.importorskip("torch", reason="the executor needs torch (pip install torch)")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from exec.measure.microbench import Plan, calibrate  # noqa: E402
from exec.measure.validation import cases, validate  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.config import RunConfig  # noqa: E402
from sim.core.errors import ConfigError  # noqa: E402
from sim.hardware.costs.calibration import Calibration  # noqa: E402

TINY = {
    "topology": "localhost-cpu",
    "model": {
        "batch": 1,
        "seq_len": 64,
        "model_dim": 32,
        "hidden_dim": 64,
        "experts_per_gpu": 2,
        "top_k": 1,
        "capacity_factor": 1.0,
        "dtype": "fp32",
    },
    "strategy": {"name": "pipelined", "degree": 2},
    "passes": ["fwd", "bwd"],
}


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    cal, rows = calibrate(2, "gloo", Plan.quick(), log=lambda _m: None)
    path = cal.save(tmp_path_factory.mktemp("cal") / "cal.yaml")
    return cal, rows, path


def test_calibration_is_sane(calibration):
    cal, rows, path = calibration
    assert set(rows["bench"]) == {"gemm", "memory", "copy", "comm", "overlap"}
    # a CPU runs every dtype as fp32: one GEMM fit, which the file says stands for the others
    assert set(cal.compute["gemm"]) == {"fp32"}
    assert cal.meta["stand_ins"]["bf16"] == "fp32" and cal.meta["device_type"] == "cpu"
    gemm = cal.compute["gemm"]["fp32"]
    assert gemm["alpha"] >= 0 and gemm["beta"] >= 0 and gemm["alpha"] + gemm["beta"] > 0
    assert "r2" in gemm and "mean_error" in gemm  # reported, never asserted
    layouts = set(rows.loc[rows["op"] == "gemm", "layout"])
    assert {"nn", "nt", "tn"} <= layouts  # forward, dgrad, wgrad
    for kind in ("elementwise", "gate", "encode", "decode", "d2h", "h2d"):
        assert cal.compute[kind]["beta"] >= 0
    a2a = {f["ranks"]: f for f in cal.collectives["all_to_all"]}[2]
    assert a2a["alpha"] >= 0 and a2a["beta"] >= 0
    for row in cal.interference.values():
        assert all(0 < v <= 1 for v in row.values())
    assert set(cal.dispatch) == {"stream", "cross"}
    assert cal.dispatch["stream"]["mean"] >= 0 and cal.dispatch["cross"]["mean"] >= 0
    assert cal.dispatch["cross"]["n"] >= 2 * Plan.quick().overlap_reps
    for key in ("host", "torch", "python", "device_name", "measured_at"):
        assert cal.meta[key], key
    assert min(min(q) for q in cal.jitter.values()) > 0
    assert Calibration.load(path).to_dict() == cal.to_dict()


@pytest.mark.slow  # ten graphs measured; the strategies test below runs validate end to end
def test_validate_writes_its_report(calibration, tmp_path):
    cfg = RunConfig.from_dict(TINY)
    res = validate(cfg, 2, str(calibration[2]), tmp_path, repeats=1, log=lambda _m: None)
    names = [r["graph"] for r in res["results"]]
    assert names == [c.name for c in cases(cfg.layer(2).capacity)]
    assert all(r["measured_s"] > 0 and r["simulated_s"] > 0 for r in res["results"])
    assert all(r["tasks_matched"] > 0 for r in res["results"])
    s = res["summary"]
    assert s["mape_pct"] >= 0 and s["best_measured"] in names
    assert set(s["best_simulated"]) <= set(names)
    md = (tmp_path / "report.md").read_text()
    assert "MAPE" in md and "pipelined r=2 fwd+bwd" in md
    assert (tmp_path / "report.html").is_file() and (tmp_path / "validation.json").is_file()
    assert len(list((tmp_path / "traces").glob("*.measured.csv"))) == len(names)


def test_validate_other_strategies_and_refuse_bad_ones_before_measuring(calibration, tmp_path):
    cfg = RunConfig.from_dict(TINY)
    res = validate(
        cfg,
        2,
        str(calibration[2]),
        tmp_path,
        repeats=1,
        log=lambda _m: None,
        strategies=["mpipemoe:degree=2,reuse=S1"],
    )
    names = [r["graph"] for r in res["results"]]
    assert names == ["mpipemoe:degree=2,reuse=S1 fwd", "mpipemoe:degree=2,reuse=S1 fwd+bwd"]
    assert all(r["measured_s"] > 0 and r["tasks_matched"] > 0 for r in res["results"])
    assert "d2h" in res["results"][1]["per_kind"]  # the offload ran on both sides
    assert res["summary"]["mape_pct"] >= 0 and res["summary"]["best_measured"] in names
    assert "MAPE" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.html").is_file() and (tmp_path / "validation.json").is_file()
    assert len(list((tmp_path / "traces").glob("*.measured.csv"))) == len(names)
    with pytest.raises(ConfigError, match="strategy.tp"):  # TP groups do not fit a node of 1
        validate(cfg, 2, str(calibration[2]), tmp_path / "x", strategies=["ted:tp=2"])
    assert not (tmp_path / "x" / "traces").exists()  # refused before measuring anything


def test_cli_calibrate_and_simulate_with_it(calibration, tmp_path, capsys, monkeypatch):
    """`moesim calibrate` writes what it measured (here: the fixture's measurement, not a
    second one) and `moesim simulate --calibration` reads it back."""
    import exec.measure.microbench as microbench

    seen = {}

    def measured(nprocs, backend, plan, timeout_s):
        seen.update(nprocs=nprocs, plan=plan)
        return calibration[0], calibration[1]

    monkeypatch.setattr(microbench, "calibrate", measured)
    out = tmp_path / "cal.yaml"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "nodes": 2}))
    args = ["calibrate", "--nprocs", "2", "--quick", "--out", str(out), "--shapes-from", str(cfg)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "gemm fp32" in printed and "bf16 runs as fp32" in printed and out.is_file()
    assert (tmp_path / "cal.measurements.csv").is_file()
    assert seen["nprocs"] == 2 and {s[5] for s in seen["plan"].gemm_shapes} == {"nn", "nt", "tn"}
    assert (
        main(
            [
                "simulate",
                str(cfg),
                "--calibration",
                str(out),
                "--json",
                "--out",
                str(tmp_path / "sim"),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["network"] == "collective" and summary["makespan_s"] > 0
