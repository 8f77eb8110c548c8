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
    assert (df["makespan_s"] > 0).all() and df["vs_best"].min() == 1.0
    assert df.loc[2, "params"].startswith("degree=")  # the degree Theorem 1 chose
    assert (df["exposed_comm_s"] <= df["makespan_s"]).all()


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
    per_token = df["makespan_s"] / df["tokens"]
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
    names = {"results.csv", "compare.md", "compare.html", "config.yaml", "manifest.json"}
    assert {p.name for p in (tmp_path / "o").iterdir()} == names
    assert main(["compare", str(cfg), "--strategies", "nope"]) == 2


def test_compare_writes_nothing_without_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(json.dumps(CFG))
    assert main(["compare", "c.yaml", "--strategies", "sequential"]) == 0
    assert "| sequential |" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]
    # --strategy / --param are refused, pointing to --strategies (not silently ignored)
    assert main(["compare", "c.yaml", "--strategies", "pipelined", "--param", "degree=2"]) == 2
    assert "--strategies" in capsys.readouterr().err


def test_chart_plots_time_per_token_and_results_rows(tmp_path):
    """The chart's first panel is the table's ranking metric (time per token), so a layout
    that processes fewer tokens cannot look best by finishing sooner; makespan is beside it."""
    from sim.analysis.compare import figure, results_rows
    from sim.analysis.results import load_results

    cfg = RunConfig.from_dict({**CFG, "costs": {"compute": "roofline"}})
    df = compare(cfg, ["sequential", "ted:tp=2"])
    fig = figure(df, "t")
    per_token, makespan = fig.data[0], fig.data[1]
    assert list(per_token.y) == pytest.approx(list(df["time_per_token_s"] * 1e9))  # shown in ns
    assert list(makespan.y) == pytest.approx(list(df["makespan_s"] * 1e3))  # shown in ms
    assert fig.layout.yaxis.title.text == "time per token (ns)"
    assert df["time_per_token_s"].to_numpy() == pytest.approx(
        (df["makespan_s"] / df["tokens"]).to_numpy()
    )
    rows = results_rows(df)
    rows.to_csv(tmp_path / "results.csv", index=False)
    back = load_results([tmp_path / "results.csv"])
    assert list(back["strategy"]) == ["sequential", "ted:tp=2"]
    assert back["time_per_token_s"].to_numpy() == pytest.approx(
        (back["makespan_s"] / back["tokens"]).to_numpy()
    )
    assert back["config"].nunique() == 1 and back["run_id"].nunique() == 2
    assert float(back.loc[1, "param.tp"]) == 2  # the parameter the TED row ran with
    assert df["param.tp"].dtype == "Int64" and df.loc[1, "param.tp"] == 2  # typed, not text


@pytest.mark.slow  # the demo layer (16 GPUs, fwd + bwd), five strategies and a report: ~15 s
def test_readme_compare_examples_run_on_the_demo_config(tmp_path, monkeypatch):
    """The README's compare lines, as written, with my.yaml the embedded demo config."""
    import re
    import shlex
    from importlib import resources
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = re.findall(r"^moesim ((?:compare|report cmp) [^#\n]*)", readme, flags=re.M)
    assert any("pipemoe" in x for x in lines) and any("collective" in x for x in lines)
    demo = resources.files("sim.configs").joinpath("demo.yaml").read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(demo)
    for line in lines:
        assert main(shlex.split(line)) == 0, line
    assert (tmp_path / "rep" / "report.html").is_file()  # the report of the compare above


def test_with_blocks_every_entry_is_the_model_and_scopes_are_named():
    """`compare` builds what `simulate` builds: with `model.blocks` a layer strategy's graph
    is the model (attention and all), so it ranks against megatron_ep's stage of the same
    blocks; without, the table says which rows hold attention beside their MoE layer."""
    blocks = {"n": 2, "heads": 4, "moe_every": 1, "flash": True}
    base = {**CFG, "passes": ["fwd", "bwd"], "costs": {"compute": "roofline"}}
    entries = ["sequential", "megatron_ep:micro=1,layers=2,heads=4,overlap=false"]
    alone = compare(RunConfig.from_dict(base), entries).set_index("strategy")
    model = RunConfig.from_dict({**base, "model": {**base["model"], "blocks": blocks}})
    both = compare(model, entries).set_index("strategy")
    assert list(alone["scope"]) == ["one MoE layer", "2 MoE blocks with attention"]
    assert list(both["scope"]) == ["the model", "the model"]
    # the layer strategy now carries the attention of both blocks
    assert both.loc["sequential", "makespan_s"] > 2 * alone.loc["sequential", "makespan_s"]
    from sim.analysis.compare import SCOPES_DIFFER, to_markdown

    assert SCOPES_DIFFER in to_markdown(alone.reset_index())
    assert SCOPES_DIFFER not in to_markdown(both.reset_index())
    # the founding papers' strategies and DeepEP rank against Megatron's on the same model
    more = compare(model, ["pipemoe", "tutel", "deepep:gpus_per_node=4", entries[1]])
    assert set(more["scope"]) == {"the model"} and more["vs_best"].min() == 1.0
    dense = {**blocks, "n": 3, "first_dense": 1}
    mixed = RunConfig.from_dict({**base, "model": {**base["model"], "blocks": dense}})
    assert list(compare(mixed, entries)["scope"]) == ["the model", "the model's MoE blocks"]
