"""`moesim report`: result tables in the shared schema, best per config, and the baseline
gate CI relies on (0 no regression, 1 regression naming the config, 2 bad input)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.analysis.report import against, build
from sim.analysis.results import REQUIRED, load_results, parse_threshold
from sim.cli import main
from sim.core.errors import ConfigError


def rows(scale: dict[tuple[str, str], float] | None = None) -> pd.DataFrame:
    """Two configs x three strategies, as a sweep writes them; `scale` slows some runs."""
    out = []
    for c, nodes in (("topology=dgx-a100,nodes=2", 2), ("topology=dgx-a100,nodes=4", 4)):
        for s, t in (("sequential", 10e-3), ("pipelined:degree=4", 8e-3), ("pipemoe", 7.5e-3)):
            t *= (scale or {}).get((c, s), 1.0)
            tokens = 4096 * 8 * nodes
            out.append(
                {
                    "run_id": f"{c}|{s}",
                    "config": c,
                    "strategy": s,
                    "status": "ok",
                    "error": "",
                    "makespan_s": t,
                    "time_per_token_s": t / tokens,
                    "tokens": tokens,
                    "gpus": 8 * nodes,
                    "param.nodes": nodes,
                }
            )
    return pd.DataFrame(out)


def write(tmp: Path, name: str, df: pd.DataFrame) -> str:
    p = tmp / name
    df.to_parquet(p) if name.endswith(".parquet") else df.to_csv(p, index=False)
    return str(p)


def test_threshold_parsing():
    assert parse_threshold("5%") == pytest.approx(0.05)
    assert parse_threshold("0.05") == pytest.approx(0.05)
    assert parse_threshold("0") == 0.0
    assert parse_threshold("150%") == pytest.approx(1.5)
    for bad in ("5", "abc", "-1%", "nan", "inf%", ""):
        with pytest.raises(ConfigError, match="--threshold"):
            parse_threshold(bad)


def test_best_per_config_and_error_rows(tmp_path):
    df = rows()
    df.loc[0, ["status", "error", "makespan_s", "time_per_token_s"]] = [
        "error",
        "ConfigError: too big",
        float("nan"),
        float("nan"),
    ]
    rep = build([write(tmp_path, "r.csv", df)])
    best = rep.best().set_index("config")
    assert list(best["best"]) == ["pipemoe", "pipemoe"]
    assert best["margin_pct"].iloc[0] == pytest.approx(100 * (8 / 7.5 - 1))
    assert list(rep.errors()["error"]) == ["ConfigError: too big"]


def test_against_verdicts():
    base = rows()
    new = rows(
        {
            ("topology=dgx-a100,nodes=4", "pipemoe"): 1.10,
            ("topology=dgx-a100,nodes=2", "sequential"): 0.90,
            ("topology=dgx-a100,nodes=2", "pipemoe"): 1.04,
        }
    )
    new.loc[1, "status"] = "error"
    d = against(new, base, 0.05).set_index(["config", "strategy"])["verdict"]
    assert d[("topology=dgx-a100,nodes=4", "pipemoe")] == "slower"
    assert d[("topology=dgx-a100,nodes=2", "sequential")] == "faster"
    assert d[("topology=dgx-a100,nodes=2", "pipemoe")] == "same"  # 4% < 5%
    assert d[("topology=dgx-a100,nodes=2", "pipelined:degree=4")] == "now failing"
    assert d[("topology=dgx-a100,nodes=4", "sequential")] == "same"


def test_planted_regression_exits_1_naming_the_config(tmp_path, capsys):
    base = write(tmp_path, "old.parquet", rows())
    slow = write(tmp_path, "new.parquet", rows({("topology=dgx-a100,nodes=4", "pipemoe"): 1.2}))
    assert main(["report", slow, "--baseline", base, "--threshold", "5%"]) == 1
    captured = capsys.readouterr()
    assert "topology=dgx-a100,nodes=4" in captured.err
    assert "topology=dgx-a100,nodes=2" not in captured.err
    assert "REGRESSED" in captured.out
    # a threshold above the change lets it pass; an equal baseline always does
    assert main(["report", slow, "--baseline", base, "--threshold", "0.25"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["report", base, "--baseline", base, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["regressed_configs"] == [] and summary["changes"] == []


def test_report_files_are_one_self_contained_set(tmp_path, capsys):
    base = write(tmp_path, "old.csv", rows())
    slower = rows({("topology=dgx-a100,nodes=2", "sequential"): 1.5})
    failed = slower.iloc[[5]].assign(  # a run that fails is reported, never fatal
        strategy="ted:tp=3",
        status="error",
        error="ConfigError: tp=3 does not divide 8",
        makespan_s=float("nan"),
        time_per_token_s=float("nan"),
    )
    new = write(tmp_path, "new.csv", pd.concat([slower, failed, slower.iloc[[0]]]))
    out = tmp_path / "rep"
    assert main(["report", new, "--baseline", base, "--out", str(out)]) == 1
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "report.html", "report.json", "report.md"]
    html = (out / "report.html").read_text()
    once, remote = html.count("* plotly.js v") == 1, '<script src="http' in html
    assert once and not remote
    assert ("<title>moesim report" in html) and ("time per token (ns)" in html)
    md = (out / "report.md").read_text()
    assert "| topology=dgx-a100,nodes=2 | sequential |" in md and "+50.0%" in md
    assert "slower" in md
    assert "no trace for" in md  # a sweep's rows carry no traces: said, not failed
    assert "| ted:tp=3 | ConfigError: tp=3 does not divide 8 |" in md
    assert "1 repeated (config, strategy) row(s)" in md
    assert json.loads((out / "report.json").read_text())["regressed_configs"] == [
        "topology=dgx-a100,nodes=2"
    ]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("a,b\n1,2\n", "not a moesim results table"),
        ("", "not a readable CSV"),
        (None, "not found"),
        ("TRUNCATE", r"line 7 is incomplete \(no line break"),  # cut: said before parsing
    ],
)
def test_bad_results_files_are_one_line_exit_2(tmp_path, capsys, content, match):
    p = tmp_path / "r.csv"
    if content == "TRUNCATE":
        text = rows().to_csv(index=False)
        content = text[: text.rindex(",ok,") + 8]  # the last row cut inside its numbers
    if content is not None:
        p.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_results([str(p)])
    assert main(["report", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("moesim: error:")


def test_truncated_parquet_and_foreign_json(tmp_path, capsys):
    good = Path(write(tmp_path, "r.parquet", rows()))
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert main(["report", str(cut)]) == 2
    assert "not a readable Parquet table" in capsys.readouterr().err
    foreign = tmp_path / "validation.json"
    foreign.write_text('{"hello": 1}')
    assert main(["report", str(tmp_path / "validation.json")]) == 2
    assert "not a moesim validate output" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "empty-dir-missing")]) == 2
    assert main(["report", str(good), "--threshold", "5"]) == 2


def test_validate_output_gives_measured_and_timelines(tmp_path):
    """A validate output directory: simulated and measured makespans per graph, its traces
    drawn as timelines, and the sim-vs-measured section."""
    from sim.analysis.report import write as write_report

    val = tmp_path / "val"
    (val / "traces").mkdir(parents=True)
    trace = pd.DataFrame(
        {
            "id": ["a", "b"],
            "rank": [0, 0],
            "stream": ["compute", "comm"],
            "kind": ["gemm", "all_to_all"],
            "start": [0.0, 0.001],
            "end": [0.002, 0.003],
        }
    )
    results = []
    for name, m, s in (("sequential fwd", 0.010, 0.011), ("pipelined r=2 fwd", 0.008, 0.0075)):
        results.append(
            {
                "graph": name,
                "measured_s": m,
                "simulated_s": s,
                "error_pct": 100 * (s / m - 1),
                "tasks_matched": 2,
                "per_kind": {},
                "measured_runs_s": [m],
            }
        )
        slug = name.replace("=", "").replace(" ", "_")
        trace.to_csv(val / "traces" / f"{slug}.simulated.csv", index=False)
    ctx = {"layer": "B=2 L=64 M=32 H=64 E=2 top-1 f=1.0 C=64 fp32", "ranks": "2 (gloo)"}
    (val / "validation.json").write_text(
        json.dumps({"summary": {}, "results": results, "context": ctx, "files": {}})
    )
    df = load_results([str(val)])
    assert list(df["strategy"]) == ["sequential", "pipelined r=2"]
    assert df["tokens"].tolist() == [256, 256] and df["measured_s"].tolist() == [0.010, 0.008]
    rep = build([str(val)])
    files = write_report(rep, tmp_path / "rep")
    md = files["markdown"].read_text()
    assert "Simulated against measured: MAPE" in md and "+10.0%" in md
    html = files["html"].read_text()
    assert ("simulated makespan (ms)" in html) and ("best: pipelined r=2 (simulated)" in html)


def test_required_columns_are_the_shared_schema():
    assert REQUIRED == (
        "run_id",
        "config",
        "strategy",
        "status",
        "error",
        "makespan_s",
        "time_per_token_s",
        "tokens",
        "gpus",
    )
