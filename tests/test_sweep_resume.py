"""`moesim sweep` killed and restarted, and run on Dask: every row exactly once, and the same
rows as an uninterrupted in-process sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.analysis.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
SPEC = {
    "base": {
        "topology": "flat-switch",
        "nodes": 2,
        "model": {
            "batch": 1,
            "seq_len": 256,
            "model_dim": 256,
            "hidden_dim": 512,
            "experts_per_gpu": 2,
            "top_k": 2,
        },
        "strategy": "sequential",
        "passes": ["fwd", "bwd"],
    },
    "grid": {
        "nodes": [1, 2, 4],
        "model.model_dim": [128, 256],
        "strategy": ["sequential", "pipelined:degree=2", "pipelined:degree=4"],
    },
}
POINTS = 3 * 2 * 3


def _same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    keep = [c for c in a.columns if c != "wall_s"]
    pd.testing.assert_frame_equal(a[keep].reset_index(drop=True), b[keep].reset_index(drop=True))


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    """The sweep run once, uninterrupted, in this process."""
    return run_sweep(SPEC, workers=1)


def _sweep_cmd(spec: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", "sweep", str(spec), "--out", str(out), *extra]


def test_killed_sweep_restarted_has_every_row_once(tmp_path, reference):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    out = tmp_path / "out"
    rows = out / "rows"
    proc = subprocess.Popen(
        _sweep_cmd(spec, out, "--workers", "1"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if rows.is_dir() and len(list(rows.glob("*.parquet"))) >= 2:
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"the sweep ended before it was killed: {proc.stderr.read()}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = len(list(rows.glob("*.parquet")))
    assert 2 <= before < POINTS and not (out / "results.parquet").exists()
    # restarted (in two local worker processes this time): only the missing points run
    stats: dict = {}
    df = run_sweep(spec, out=out, workers=2, stats=stats)
    assert stats["skipped"] == before and stats["ran"] == POINTS - before
    assert len(df) == POINTS and df["run_id"].is_unique and (df["status"] == "ok").all()
    assert len(list(rows.glob("*.parquet"))) == POINTS and not list(rows.glob(".*"))
    _same_rows(df, reference)
    _same_rows(pd.read_parquet(out / "results.parquet"), reference)


def test_dask_local_cluster_gives_the_same_rows(tmp_path, reference):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        df = run_sweep(SPEC, out=tmp_path / "o", scheduler=cluster.scheduler_address)
    _same_rows(df, reference)
    _same_rows(pd.read_parquet(tmp_path / "o" / "results.parquet"), reference)
