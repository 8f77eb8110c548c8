"""`moesim sweep`: spec errors name their place, the cross product and its rows, per-row
failures, resuming in-process, output directories refused before any run."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from sim.analysis.sweep import run_sweep
from sim.analysis.sweep.run import COLUMNS
from sim.analysis.sweep.spec import load
from sim.analysis.sweep.store import Store
from sim.cli import main
from sim.core.errors import ConfigError
from tests.configs import TINY_FLAT

BASE = TINY_FLAT


def _spec(**kw) -> dict:
    return {"base": BASE, **kw}


def _same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal but for the wall time each run took."""
    keep = [c for c in a.columns if c != "wall_s"]
    pd.testing.assert_frame_equal(a[keep].reset_index(drop=True), b[keep].reset_index(drop=True))


# -- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, match",
    [
        (_spec(grid={"model.modle_dim": [64]}), r"grid\.model\.modle_dim: unknown key \(known: "),
        (_spec(grid={"nodes": [2, "x"]}), r"point nodes=x: nodes=x: expected a number"),
        (
            _spec(grid={"model.model_dim": [128, -5]}),
            r"point model.model_dim=-5: model.model_dim: "
            r"must be > 0, got -5",
        ),
        (
            _spec(grid={"topology": ["flat-switch", "nope"]}),
            r"point topology=nope: unknown topology",
        ),
        (
            _spec(grid={"strategy": ["pipelined:degre=2"]}),
            r"point strategy=pipelined:degre=2: .*"
            r"unknown parameter",
        ),
        (_spec(grid={"link.nvlink.bw": ["*2"]}), r"point link.nvlink.bw=\*2: .*no link class"),
        (_spec(grid={"nodes": []}), r"grid.nodes: list should have at least 1 item"),
        (_spec(grid={"nodes": [2, 2]}), r"are the same run"),
        (_spec(grdi={}), r"grdi: unknown key \(did you mean 'grid'\?\)"),
        (
            _spec(grid={"nodes": [2]}, zip=[{"nodes": [4]}]),
            r"zip\[0\]: nodes: 'nodes' is also "
            r"varied in grid",
        ),
        (
            _spec(zip=[{"model.model_dim": [64, 128], "model.hidden_dim": [64]}]),
            r"zip\[0\]: the lists of a zip group need one length",
        ),
        ({"base": {"topology": "flat-switch"}}, r"base: model: required"),
        (_spec(passes=["sideways"]), r"passes.0: expected 'fwd' or 'bwd'"),
    ],
)
def test_spec_errors_name_their_place(spec, match):
    with pytest.raises(ConfigError, match=match) as e:
        load(spec)
    assert "\n" not in str(e.value) and str(e.value).startswith("sweep spec <dict>")


def test_spec_file_errors_exit_2_in_one_line_before_any_run(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec(grid={"nodes": [2, 0]})))
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"sweep spec {spec}: point nodes=0: nodes: " in err
    assert not out.exists()
    # a base config named by a path relative to the spec file, whose own error names it
    (tmp_path / "b.yaml").write_text("topology: flat-switch\n")
    spec.write_text("base: b.yaml\n")
    assert main(["sweep", str(spec), "--out", str(out)]) == 2
    assert f"s.yaml: base: {tmp_path / 'b.yaml'}: model: required" in capsys.readouterr().err


def test_unusable_output_dir_fails_before_running(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec(grid={"nodes": [2]})))
    (tmp_path / "file").write_text("")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "file" / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory" in err


# -- rows ------------------------------------------------------------------------------------


def test_cross_product_rows_and_labels():
    spec = _spec(
        grid={"nodes": [2, 4], "strategy": ["sequential", "pipelined:degree=2"]},
        zip=[{"model.model_dim": [128, 256], "model.hidden_dim": [256, 512]}],
    )
    df = run_sweep(spec, workers=1)
    assert len(df) == 2 * 2 * 2 and (df["status"] == "ok").all()
    params = ["param.nodes", "param.strategy", "param.model.model_dim", "param.model.hidden_dim"]
    assert list(df.columns) == list(COLUMNS) + params
    assert df["run_id"].is_unique
    first = df.iloc[1]  # the last axis varies fastest
    assert first["config"] == "nodes=2,model.model_dim=256,model.hidden_dim=512"
    assert first["strategy"] == "sequential" and first["error"] == ""
    assert df["strategy"].tolist()[-1] == "pipelined:degree=2"
    assert df["param.nodes"].dtype == "int64" and df["param.nodes"].tolist()[:4] == [2] * 4
    # tokens: B * L per GPU (no tensor parallelism); time per token as compare ranks it
    assert (df["tokens"] == 128 * df["gpus"]).all() and df["gpus"].tolist()[-1] == 4
    pd.testing.assert_series_equal(
        df["time_per_token_s"], df["makespan_s"] / df["tokens"].astype(float), check_names=False
    )


def test_rows_are_what_api_run_gives():
    """A point's row is the run `sim.commands.simulate_config` does on the same config."""
    from sim import commands

    df = run_sweep(_spec(grid={"strategy": ["sequential", "pipelined:degree=2"]}), workers=1)
    for strategy, row in zip(
        [{"name": "sequential"}, {"name": "pipelined", "degree": 2}], df.itertuples()
    ):
        s = commands.simulate_config({**BASE, "strategy": strategy}).summary
        assert row.makespan_s == s["makespan_s"]
        assert row.exposed_comm_s == s["exposed_comm_s"]


def test_tokens_are_counted_as_compare_counts_them():
    """A step of micro-batches through several MoE layers (megatron_ep) processes each token
    once per layer and micro-batch: time per token as `moesim compare` ranks it."""
    spec = _spec(grid={"strategy": ["sequential", "megatron_ep:micro=3,layers=2,shared=0"]})
    spec["base"] = {**BASE, "passes": ["fwd", "bwd"], "model": {**BASE["model"], "top_k": 1}}
    df = run_sweep(spec, workers=1)
    from sim.hardware.topology import Topology

    one = 128 * Topology.load("flat-switch", nodes=2).world_size  # one layer's tokens
    assert list(df["tokens"]) == [one, one * 3 * 2]
    assert list(df["time_per_token_s"]) == list(df["makespan_s"] / df["tokens"])


def test_link_and_compute_speed_changes_reach_the_run():
    """`sequential` on a flat switch: doubling every link's bandwidth halves the time the
    communication stream is busy (no latency on flat-switch), half the compute speed doubles
    the compute stream's; each leaves the other stream as it was."""
    df = run_sweep(_spec(grid={"link.*.bw": ["*1", "*2"], "compute.speed": [1.0, 0.5]}), workers=1)
    one, slow, fast = df.iloc[0], df.iloc[1], df.iloc[2]
    assert fast["comm_busy_s"] == pytest.approx(one["comm_busy_s"] / 2, rel=1e-9)
    assert fast["compute_busy_s"] == pytest.approx(one["compute_busy_s"], rel=1e-9)
    assert slow["compute_busy_s"] == pytest.approx(one["compute_busy_s"] * 2, rel=1e-9)
    assert slow["comm_busy_s"] == pytest.approx(one["comm_busy_s"], rel=1e-9)
    assert df["param.compute.speed"].dtype == "float64" and df["param.link.*.bw"][1] == "*1"


def test_a_failed_run_is_a_row_not_the_end_of_the_sweep(tmp_path):
    """top_k 2 on one GPU of one expert fails in the layer, not in the config schema."""
    spec = _spec(grid={"nodes": [1, 2], "model.top_k": [2]})
    df = run_sweep(spec, out=tmp_path / "o", workers=1)
    bad, good = df.iloc[0], df.iloc[1]
    assert bad["status"] == "error" and "top_k: 2 exceeds the 1 experts" in bad["error"]
    assert pd.isna(bad["makespan_s"]) and pd.isna(bad["tokens"])
    assert good["status"] == "ok" and good["makespan_s"] > 0
    # the same rows on disk, and a retry of errors runs only the failed one
    _same_rows(pd.read_parquet(tmp_path / "o" / "results.parquet"), df)
    stats: dict = {}
    run_sweep(spec, out=tmp_path / "o", workers=1, retry_errors=True, stats=stats)
    assert (stats["ran"], stats["skipped"], stats["failed"]) == (1, 1, 1)


# -- resuming ----------------------------------------------------------------------------------


def test_resume_runs_only_missing_rows_and_refuses_another_spec(tmp_path):
    spec = _spec(grid={"nodes": [2, 4], "strategy": ["sequential", "pipelined:degree=2"]})
    out = tmp_path / "o"
    full = run_sweep(spec, out=out, workers=1)
    parts = sorted((out / "rows").glob("*.parquet"))
    assert len(parts) == 4
    parts[0].unlink()
    parts[2].unlink()
    (out / "rows" / ".x.parquet.tmp").write_bytes(b"half a part")  # a kill mid-write
    stats: dict = {}
    again = run_sweep(spec, out=out, workers=1, stats=stats)
    assert (stats["ran"], stats["skipped"]) == (2, 2)
    _same_rows(again, full)
    assert not list((out / "rows").glob(".*.tmp"))
    # another spec is refused (one line), unless restarted
    other = _spec(grid={"nodes": [2]})
    with pytest.raises(ConfigError, match="holds a sweep of another spec .* --restart"):
        run_sweep(other, out=out, workers=1)
    df = run_sweep(other, out=out, workers=1, restart=True)
    assert len(df) == 1 and len(list((out / "rows").glob("*.parquet"))) == 1


def test_one_sweep_at_a_time_per_directory(tmp_path):
    sweep = load(_spec(grid={"nodes": [2]}))
    held = Store(tmp_path, sweep)
    try:
        with pytest.raises(ConfigError, match="another sweep is writing there now"):
            Store(tmp_path, sweep)
    finally:
        held.close()
    Store(tmp_path, sweep).close()


def test_cli_prints_counts_and_best(tmp_path, capsys):
    import json

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec(grid={"strategy": ["sequential", "pipelined:degree=2"]})))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["points"], doc["ran"], doc["failed"]) == (2, 2, 0)
    assert doc["best"][0]["config"] == "base" and doc["files"]["parquet"].endswith(".parquet")
    assert main(["schema", "sweep"]) == 0
    assert "grid" in json.loads(capsys.readouterr().out)["properties"]


def test_shipped_example_spec_validates():
    from pathlib import Path

    sweep = load(Path(__file__).resolve().parents[1] / "sim" / "configs" / "sweep_demo.yaml")
    assert len(sweep.points) == 2 * 3 * 2 * 2
    assert sweep.keys == ["nodes", "strategy", "link.*.bw", "model.model_dim", "model.hidden_dim"]
    assert sweep.points[0].raw["passes"] == ["fwd", "bwd"]


def _die(point):  # a worker process killed under its run (out of memory, kill -9)
    import os

    os._exit(3)


def test_a_dead_worker_process_stops_the_sweep_keeping_rows(tmp_path, monkeypatch):
    """Which point killed a local worker is unknown: no row is blamed, the sweep stops in one
    line, and the same command resumes it."""
    import sim.analysis.sweep.driver as sweep_mod
    from sim.core.errors import MoesimError

    spec = _spec(grid={"nodes": [2, 4]})
    monkeypatch.setattr(sweep_mod, "run_point", _die)
    with pytest.raises(MoesimError, match="sweep stopped: BrokenProcessPool.*run the same command"):
        run_sweep(spec, out=tmp_path, workers=2)
    assert not list((tmp_path / "rows").glob("*.parquet"))
    monkeypatch.undo()
    assert (run_sweep(spec, out=tmp_path, workers=1)["status"] == "ok").all()


def test_the_sweep_bar_hears_a_heartbeat_while_no_run_finishes(monkeypatch):
    """Issue 21, item 11: while no run has finished (a Dask cluster's first result can take a
    minute) the result stream yields heartbeats, so the bar redraws and says what it waits
    for; every row still arrives once."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sim.analysis.sweep import driver as sweep_mod
    from sim.core import pool as pool_mod

    monkeypatch.setattr(pool_mod, "HEARTBEAT_S", 0.01)
    go = threading.Event()

    def slow(x):
        go.wait(5)
        return {"run_id": x}

    pool = ThreadPoolExecutor(2)
    futures = {pool.submit(slow, i): i for i in range(2)}
    stream = pool_mod.drain(pool, futures)
    assert next(stream) is None  # nothing finished yet: a heartbeat, not a wait
    go.set()
    rows = [g[1] for g in stream if g is not None]
    assert sorted(r["run_id"] for r in rows) == [0, 1]
    bar = sweep_mod._bar(2, 0, False, "waiting for tcp://x")
    assert bar._postfix() == "waiting for tcp://x"
    bar(False)
    assert bar._postfix() == "failed 0"


def test_a_server_that_is_not_a_dask_scheduler_is_refused_in_one_line(tmp_path, capsys):
    """A server that answers the handshake with bytes distributed reads as a frame length of
    exabytes (seen: an HTTP proxy on the scheduler's address, whose "HTTP/1.1" is 3.5e18 as a
    little-endian length) is a refused --scheduler, not "out of memory"."""
    pytest.importorskip("distributed")
    import contextlib
    import socket
    import threading

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec()))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # 8 bytes: 3.5e18
                conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        address = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
        rc = main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--scheduler", address])
    finally:
        srv.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and f"--scheduler {address}: cannot connect" in err[0], err
    assert "memory" not in err[0]
