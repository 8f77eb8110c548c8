"""Outputs are written as one set: unusable paths fail before a run, a failed or killed run
leaves the previous set whole and no temporary files, and a new run never mixes with an old
one (it is staged, then swapped in whole)."""

from __future__ import annotations

import json
import os

import pytest

from sim.core.errors import ConfigError
from sim.core.io import MANIFEST, STAGE_PREFIX, OutputSet, check_output_dir, verify_set


def test_a_finished_set_has_a_manifest_naming_its_files(tmp_path):
    with OutputSet(tmp_path / "run", "simulate") as out:
        out.write_text("summary.json", "{}")
        out.write_bytes("trace.csv", b"a,b\n")
    m = json.loads((tmp_path / "run" / MANIFEST).read_text())
    assert m["kind"] == "simulate" and sorted(m["files"]) == ["summary.json", "trace.csv"]
    assert verify_set(tmp_path / "run") == []
    (tmp_path / "run" / "trace.csv").write_text("other")
    assert "changed since the run wrote it" in verify_set(tmp_path / "run")[0]


def test_a_failed_run_leaves_the_previous_set_whole_and_no_temp_files(tmp_path):
    d = tmp_path / "run"
    with OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "old")
        out.write_text("trace.chrome.json", "old")
    with pytest.raises(KeyboardInterrupt), OutputSet(d, "simulate") as out:
        out.write_text("trace.csv", "new")
        assert not (d / "trace.csv").exists()  # staged: not in the folder before the swap
        raise KeyboardInterrupt
    assert (d / "summary.json").read_text() == "old"  # the old set, as it was
    assert verify_set(d) == []
    assert not (d / "trace.csv").exists()
    assert sorted(os.listdir(d)) == [MANIFEST, "summary.json", "trace.chrome.json"]


def test_a_new_set_replaces_the_old_one_whole_and_keeps_foreign_files(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "notes.txt").write_text("the user's")
    with OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "old")
        out.write_text("config.yaml", "old")
    with OutputSet(d, "replay") as out:
        out.write_text("summary.json", "new")
        out.write_text("sub/trace.csv", "new")
    assert sorted(os.listdir(d)) == [MANIFEST, "notes.txt", "sub", "summary.json"]
    assert (d / "summary.json").read_text() == "new" and verify_set(d) == []
    assert json.loads((d / MANIFEST).read_text())["kind"] == "replay"


def test_a_killed_run_leaves_the_previous_set_and_its_staging_is_removed_next_time(tmp_path):
    d = tmp_path / "run"
    with OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "old")
    stage = d / f"{STAGE_PREFIX}999999999-abc"  # as a SIGKILLed writer leaves it (no such pid)
    stage.mkdir()
    (stage / "summary.json").write_text("half")
    assert verify_set(d) == []
    OutputSet(d, "simulate").abort()
    assert not stage.exists() and (d / "summary.json").read_text() == "old"


def test_stale_temp_files_of_a_killed_run_are_removed(tmp_path):
    (tmp_path / ".trace.csv.abc.tmp").write_text("half")
    OutputSet(tmp_path, "simulate").close()
    assert not (tmp_path / ".trace.csv.abc.tmp").exists()


def test_names_outside_the_set_are_refused(tmp_path):
    out = OutputSet(tmp_path, "simulate")
    for bad in ("../x", "/etc/passwd", MANIFEST, ""):
        with pytest.raises(ValueError):
            out.path(bad)
    out.abort()


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
