"""Files are written where `--out` says and nowhere else (issue 21, item 6).

Run from a working directory (standing in for a clone of the repository), no command leaves
files there unless told to: `simulate` and a graph replay without `--out` print and write
nothing, `graph` needs `-o`, the executor's commands need `--out` (refused before anything
is measured), and `demo` writes outside the working directory. A replay into the folder of an
earlier run replaces that set whole: no summary or config of the earlier run stays beside the
new traces.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import yaml

from sim.cli import main
from sim.cli.simulate import _DEMO_OUT
from sim.core.io import MANIFEST, verify_set
from tests.configs import SMALL


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse's own exits
            rc = int(e.code or 0)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(SMALL))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_simulate_without_out_writes_nothing(cwd):
    rc, out, _ = _run("simulate", "my.yaml", "--json")
    assert rc == 0 and json.loads(out)["makespan_s"] > 0
    assert sorted(os.listdir(cwd)) == ["my.yaml"]


def test_graph_needs_an_output_path(cwd):
    rc, _, err = _run("graph", "my.yaml")
    assert rc == 2 and "-o/--output" in err and "\n" not in err.strip()
    assert sorted(os.listdir(cwd)) == ["my.yaml"]


@pytest.mark.parametrize(
    "argv, missing",
    [
        (("exec", "my.yaml", "--nprocs", "1"), "--out"),
        (("validate", "my.yaml", "--nprocs", "1"), "--out"),
        (("calibrate", "--nprocs", "1"), "--out"),
    ],
)
def test_executor_commands_need_out_before_measuring(cwd, argv, missing):
    rc, _, err = _run(*argv)
    assert rc == 2 and missing in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(cwd)) == ["my.yaml"]


def test_demo_default_is_outside_the_working_directory(cwd):
    assert not os.path.abspath(_DEMO_OUT).startswith(str(cwd))


def test_a_replay_into_an_earlier_run_replaces_its_set_whole(cwd):
    assert _run("simulate", "my.yaml", "--out", "run")[0] == 0
    assert {"config.yaml", "summary.json"} <= set(os.listdir(cwd / "run"))
    assert _run("graph", "my.yaml", "-o", "g.json")[0] == 0
    rc, _, err = _run("simulate", "g.json", "--topology", "dgx-a100", "--out", "run")
    assert rc == 0, err
    names = set(os.listdir(cwd / "run"))
    assert "config.yaml" not in names  # the earlier run's, which no longer describes the set
    assert {"summary.json", "trace.csv", "trace.chrome.json", MANIFEST} <= names
    assert verify_set(cwd / "run") == []
    manifest = json.loads((cwd / "run" / MANIFEST).read_text())
    assert manifest["kind"] == "replay" and "summary.json" in manifest["files"]


def test_recorded_reports_load_nothing_from_the_network():
    """Item 7: the recorded pages open offline (plotly.js embedded, no script from a CDN)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pages = [*root.glob("reports/**/*.html"), *root.glob("benchmarks/results/**/*.html")]
    assert pages
    for page in pages:
        head = page.read_text(errors="replace")
        assert not re.search(r"<script[^>]+src=[\"']https?:", head), page
