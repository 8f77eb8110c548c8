"""`moesim compare`: strategies side by side."""

from __future__ import annotations

import json

import pytest

from sim.analysis.compare import compare, parse_entry
from sim.cli import main
from sim.config import RunConfig
from sim.core.errors import ConfigError

CFG = {
    "topology": "pipemoe-2080ti",
    "nodes": 2,
    "model": {
        "batch": 2,
        "seq_len": 256,
        "model_dim": 512,
        "hidden_dim": 1024,
        "experts_per_gpu": 1,
        "top_k": 1,
        "dtype": "fp32",
    },
    "passes": ["fwd"],
    "costs": {"compute": "alpha_beta", "network": "collective"},
}


def test_parse_entry():
    assert parse_entry("pipelined:degree=8,order=alternating") == (
        "pipelined",
        {"degree": 8, "order": "alternating"},
    )
    assert parse_entry("sequential") == ("sequential", {})
    with pytest.raises(ConfigError, match="unknown strategy"):
        parse_entry("teleport")
    with pytest.raises(ConfigError, match="unknown parameter"):
        parse_entry("sequential:degree=2")


def test_compare_table_runs_each_selector():
    df = compare(RunConfig.from_dict(CFG), ["sequential", "pipelined:degree=2", "pipemoe"])
    assert list(df["strategy"]) == ["sequential", "pipelined:degree=2", "pipemoe"]
    assert (df["makespan_ms"] > 0).all() and df["vs_best"].min() == 1.0
    assert df.loc[2, "params"].startswith("degree=")  # the degree Theorem 1 chose
    assert (df["exposed_comm_ms"] <= df["makespan_ms"]).all()


def test_compare_every_strategy_and_tp_shares_tokens():
    """All strategies in one table; TED's replicas share tokens, so its row processes 1/tp
    of the tokens and is ranked by time per token, not by raw makespan."""
    names = ["sequential", "tutel", "ted:tp=2", "fastermoe:shadow=none", "mpipemoe:degree=2"]
    cfg = RunConfig.from_dict({**CFG, "costs": {"compute": "roofline"}})
    df = compare(cfg, names).set_index("strategy")
    assert df.loc["ted:tp=2", "tokens"] * 2 == df.loc["sequential", "tokens"]
    assert "tp=2" in df.loc["ted:tp=2", "params"]
    assert "reuse=" in df.loc["mpipemoe:degree=2", "params"]  # its selector's pick shows
    assert "group_size=" in df.loc["fastermoe:shadow=none", "params"]
    per_token = df["makespan_ms"] / df["tokens"]
    assert df["vs_best"].to_numpy() == pytest.approx((per_token / per_token.min()).to_numpy())


def test_compare_cli(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(CFG))  # JSON is YAML
    assert (
        main(
            [
                "compare",
                str(cfg),
                "--strategies",
                "sequential",
                "pipemoe",
                "--out",
                str(tmp_path / "o"),
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in rows] == ["sequential", "pipemoe"]
    for f in ("compare.csv", "compare.md", "compare.html"):
        assert (tmp_path / "o" / f).is_file()
    assert main(["compare", str(cfg), "--strategies", "nope"]) == 2
