"""`moesim report` reads only whole results (issue 28, item 5): a results CSV cut short or
with a short row is one error naming the file and line, a results file of an output set is
checked against its manifest (a file cut at a line break parses, but is not what the run
wrote), and a validate output with no ranks or a negative --timelines are one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from sim.analysis.results import load_results
from sim.cli import main
from sim.core.errors import ConfigError
from sim.core.io import OutputSet


def rows() -> pd.DataFrame:
    """One config, four strategies, as compare --out writes them: pipelined:degree=2 best."""
    out = []
    for s, t in (
        ("sequential", 9e-3),
        ("pipelined:degree=4", 8e-3),
        ("pipemoe", 10e-3),
        ("pipelined:degree=2", 7e-3),
    ):
        out.append(
            {
                "run_id": s,
                "config": "topology=dgx-a100,nodes=2",
                "strategy": s,
                "status": "ok",
                "error": "",
                "makespan_s": t,
                "time_per_token_s": t / 65536,
                "tokens": 65536,
                "gpus": 16,
            }
        )
    return pd.DataFrame(out)


def _refused(capsys, argv: list[str], match: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("moesim: error:"), err
    assert re.search(match, err), err
    return err


def test_csv_cut_mid_row_names_the_line(tmp_path, capsys):
    text = rows().to_csv(index=False)
    p = tmp_path / "results.csv"
    p.write_text(text[: 2 * len(text) // 3])  # the cut: mid-row, no manifest
    _refused(capsys, ["report", str(p)], r"results.csv: line \d+ is incomplete")


def test_csv_row_with_missing_fields_names_the_line(tmp_path, capsys):
    lines = rows().to_csv(index=False).splitlines()
    lines[2] = 'x,"topology=dgx-a100,nodes=2",pipemoe,ok'  # short of its numbers, line intact
    p = tmp_path / "results.csv"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"results.csv: line 3 has 4 field\(s\), the header 9"):
        load_results([str(p)])


def _compare_set(tmp: Path) -> Path:
    out = tmp / "cmp"
    with OutputSet(out, "compare") as s:
        s.write_text("results.csv", rows().to_csv(index=False))
        s.write_text("summary.md", "# compare\n")
    return out


def test_results_of_an_output_set_are_checked_against_its_manifest(tmp_path, capsys):
    out = _compare_set(tmp_path)
    assert main(["report", str(out), "--json"]) == 0  # whole: read
    assert json.loads(capsys.readouterr().out)["best"][0]["best"] == "pipelined:degree=2"
    data = (out / "results.csv").read_bytes()
    # cut at a line break: a valid, shorter CSV whose best strategy is another one
    (out / "results.csv").write_bytes(data[: data.index(b"pipemoe")])
    for target in (out, out / "results.csv"):
        _refused(capsys, ["report", str(target)], r"results.csv: changed since the run wrote it")
    (out / "results.csv").write_bytes(data)
    (out / "summary.md").unlink()  # a set missing one of its files is partial
    _refused(capsys, ["report", str(out)], r"summary.md: listed in the manifest but missing")


def test_results_of_a_set_killed_while_being_written(tmp_path, capsys):
    out = _compare_set(tmp_path)
    (out / "manifest.json").unlink()
    (out / ".moesim-new-999999999-abc").mkdir()
    _refused(capsys, ["report", str(out)], r"a partial output set \(no manifest.json")


def test_validate_output_without_ranks(tmp_path, capsys):
    val = tmp_path / "val"
    val.mkdir()
    g = {"graph": "sequential fwd", "measured_s": 0.01, "simulated_s": 0.011}
    g |= {"tasks_matched": 2, "per_kind": {}}
    ctx = {"layer": "B=2 L=64 M=32", "ranks": "0"}
    (val / "validation.json").write_text(json.dumps({"results": [g], "context": ctx}))
    _refused(capsys, ["report", str(val)], r"context ranks '0'.*expected ranks, B and L of at")


def test_negative_timelines(tmp_path, capsys):
    p = tmp_path / "results.csv"
    rows().to_csv(p, index=False)
    _refused(capsys, ["report", str(p), "--timelines", "-1"], r"--timelines -1: expected a count")
