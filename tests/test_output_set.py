"""Outputs are written as one set: unusable paths fail before a run, a killed run leaves a
detectable partial set and no temporary files, and a new run never mixes with an old one."""

from __future__ import annotations

import json
import os

import pytest

from sim.core.errors import ConfigError
from sim.core.io import MANIFEST, OutputSet, check_output_dir, verify_set


def test_a_finished_set_has_a_manifest_naming_its_files(tmp_path):
    with OutputSet(tmp_path / "run", "simulate") as out:
        out.write_text("summary.json", "{}")
        out.write_bytes("trace.csv", b"a,b\n")
    m = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert m["kind"] == "simulate" and sorted(m["files"]) == ["summary.json", "trace.csv"]
    assert verify_set(tmp_path / "run") == []
    (tmp_path / "run" / "trace.csv").write_text("other")
    assert "changed since the run wrote it" in verify_set(tmp_path / "run")[0]


def test_a_failed_run_leaves_a_detectable_partial_set_and_no_temp_files(tmp_path):
    d = tmp_path / "run"
    with OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "old")
        out.write_text("trace.chrome.json", "old")
    with pytest.raises(KeyboardInterrupt), OutputSet(d, "simulate") as out:
        out.write_text("trace.csv", "new")
        raise KeyboardInterrupt
    assert not (d / "summary.json").exists()  # the old set's files went with its manifest
    assert not (d / "trace.chrome.json").exists()
    assert "no manifest.json" in verify_set(d)[0]
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]


def test_stale_temp_files_of_a_killed_run_are_removed(tmp_path):
    (tmp_path / ".trace.csv.abc.tmp").write_text("half")
    OutputSet(tmp_path, "simulate").close()
    assert not (tmp_path / ".trace.csv.abc.tmp").exists()


@pytest.mark.parametrize(
    "make,expected",
    [
        (lambda p: (p / "f").write_text("x") and p / "f", "exists and is not a directory"),
        (lambda p: (p / "f").write_text("x") and p / "f" / "sub", "is not a directory"),
        (lambda p: p / ("n" * 300), "is over 255 bytes"),
        (lambda p: "", "expected a directory path"),
        (lambda p: "/proc/x", "cannot write there"),
    ],
)
def test_unusable_output_paths_fail_in_one_line(tmp_path, make, expected):
    with pytest.raises(ConfigError) as e:
        check_output_dir(make(tmp_path))
    assert expected in str(e.value) and "\n" not in str(e.value)
