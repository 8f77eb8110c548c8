"""Every writer of an output set, SIGKILLed at every file operation, leaves the folder holding
the whole old set or the whole new one: never less (no manifest) and never a mix.

The command runs in this process up to its output set's `close`; there the close is replayed
in forked children (the imports and the run already done, so each kill costs milliseconds),
the k-th one with os.replace / os.rename / os.unlink / os.rmdir / os.fsync wrapped to SIGKILL
it before its k-th call, for k = 1, 2, ... until one finishes; after each the folder is checked
with `verify_set` (which finishes a committed swap, as any reader does) and restored. One more
child is killed at the run's first file operation (a staging write). The hooks live here, not
in production code. A full disk (a 64 KiB tmpfs where mounting is allowed, ENOSPC injected
otherwise) fails in one line naming the option and the final path.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess

import pytest
import yaml

from sim.cli import main
from sim.core import io as sio
from sim.core.io import MANIFEST, OutputSet, verify_set
from tests.configs import SMALL

OPS = ("replace", "rename", "unlink", "rmdir", "fsync")


def _hook(kill_at: int) -> None:
    """In a forked child: SIGKILL this process at its `kill_at`-th file operation."""
    count = [0]

    def hooked(real):
        def op(*a, **kw):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **kw)

        return op

    for name in OPS:
        setattr(os, name, hooked(getattr(os, name)))


def _fork(fn, kill_at: int) -> int:
    """`fn()` in a forked child killed at its `kill_at`-th file operation; its wait status."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        rc = 99
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            _hook(kill_at)
            rc = fn()
        finally:
            os._exit(rc if isinstance(rc, int) else 0)
    return os.waitpid(pid, 0)[1]


def _state(d) -> tuple[bytes, list[str]]:
    """The manifest's bytes (after settling) and its files, checked whole: they verify and
    no other visible file is there (a stray old file beside a new set is a mix)."""
    problems = verify_set(d)  # finishes a swap a killed writer committed
    assert problems == [], problems
    listed = sorted(json.loads((d / MANIFEST).read_text())["files"])
    visible = sorted(
        str(p.relative_to(d))
        for p in d.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(d).parts)
    )
    assert visible == sorted([*listed, MANIFEST]), (visible, listed)
    return (d / MANIFEST).read_bytes(), listed


def _kill_every_close_op(monkeypatch, tmp_path) -> list[str]:
    """From now on, each OutputSet.close first replays itself in forked children, the k-th
    one SIGKILLed at its k-th file operation (k = 1, 2, ... until one finishes), checking the
    folder after each and restoring it; then it closes for real. Returns the outcomes."""
    outcomes: list[str] = []
    real_close = OutputSet.close

    def close(self):
        snap = tmp_path / f"snap{len(outcomes)}"
        shutil.copytree(self.dir, snap, symlinks=True)
        old = _state(self.dir)
        for k in range(1, 200):
            status = _fork(lambda: real_close(self) and 0, k)
            finished = os.WIFEXITED(status)
            if not finished:
                assert os.WTERMSIG(status) == signal.SIGKILL, k
                manifest, files = _state(self.dir)
                if manifest == old[0]:
                    assert files == old[1], k
                    outcomes.append("old")
                else:
                    assert files == sorted(self.files), f"kill {k}: neither old set nor new"
                    outcomes.append("new")
            shutil.rmtree(self.dir)  # as it was before this close, staging folder included
            shutil.copytree(snap, self.dir, symlinks=True)
            if finished:
                assert os.WEXITSTATUS(status) == 0, k
                break
        return real_close(self)

    monkeypatch.setattr(OutputSet, "close", close)
    return outcomes


def _exhaust(monkeypatch, tmp_path, old_fn, new_fn, d) -> list[str]:
    assert old_fn() == 0
    old = _state(d)
    # killed at its very first file operation (a staging write): the old set, untouched
    status = _fork(new_fn, 1)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert _state(d) == old
    outcomes = _kill_every_close_op(monkeypatch, tmp_path)
    assert new_fn() == 0
    _state(d)
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []  # nothing hidden left
    # both outcomes occur: the kills reached both sides of the commit
    assert "old" in outcomes and "new" in outcomes, outcomes
    return outcomes


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    w = tmp_path_factory.mktemp("inputs")
    (w / "tiny.yaml").write_text(yaml.safe_dump(SMALL))
    for degree in (2, 4):
        cfg, g = str(w / "tiny.yaml"), str(w / f"g{degree}.json")
        assert main(["graph", cfg, "--param", f"degree={degree}", "-o", g]) == 0
        argv = ["compare", cfg, "--strategies", "sequential", f"pipelined:degree={degree}"]
        assert main([*argv, "--out", str(w / f"cmp{degree}")]) == 0
    return w


WRITERS = {
    "simulate": lambda w, v: ["simulate", str(w / "tiny.yaml"), "--param", f"degree={v}"],
    "compare": lambda w, v: [
        "compare",
        str(w / "tiny.yaml"),
        "--strategies",
        "sequential",
        f"pipelined:degree={v}",
    ],
    "simulate-graph": lambda w, v: [
        "simulate",
        str(w / f"g{v}.json"),
        "--topology",
        "dgx-a100",
        "--nodes",
        "1",
    ],
    "whatif": lambda w, v: ["whatif", str(w / "tiny.yaml"), "--set", f"compute.speed=*{v}"],
    "report": lambda w, v: ["report", str(w / f"cmp{v}")],
}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_killed_writer_leaves_the_old_set_or_the_new_one(
    tmp_path, inputs, capsys, monkeypatch, writer
):
    d = tmp_path / "out"

    def run(v):
        return lambda: main([*WRITERS[writer](inputs, v), "--out", str(d)])

    assert len(_exhaust(monkeypatch, tmp_path, run(2), run(4), d)) >= 8
    capsys.readouterr()


def test_a_set_that_drops_files_is_swapped_whole(tmp_path, monkeypatch):
    """The old set has files the new one does not: killed anywhere, none of them lingers
    beside the new set, and none is missing from the old."""
    d = tmp_path / "out"

    def write(names):
        def fn():
            with OutputSet(d, "test") as out:
                for n in names:
                    out.write_text(n, f"{n} of {names}")
            return 0

        return fn

    old = write(["a.txt", "b.txt", "sub/c.txt"])
    assert len(_exhaust(monkeypatch, tmp_path, old, write(["a.txt", "d.txt"]), d)) >= 10


def _mount_tiny(path) -> bool:
    os.makedirs(path, exist_ok=True)
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def test_a_full_disk_names_the_option_and_the_final_path(tmp_path, inputs, capsys):
    disk = tmp_path / "disk"
    if not _mount_tiny(disk):
        pytest.skip("cannot mount a tmpfs here (not root?); the injected ENOSPC test covers it")
    try:
        d = disk / "out"
        with OutputSet(d, "simulate") as out:
            out.write_text("summary.json", "old")
        old = _state(d)
        (disk / "filler").write_bytes(b"x" * 40_000)
        assert main(["simulate", str(inputs / "tiny.yaml"), "--out", str(d)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"moesim: error: --out {d}/"), err
        assert "No space left on device" in err and ".moesim-" not in err, err
        assert _state(d) == old  # the previous set, whole
        assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []
        assert main(["graph", str(inputs / "tiny.yaml"), "-o", str(disk / "g.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"moesim: error: -o/--output {disk / 'g.json'}: cannot write ("), err
        assert not (disk / "g.json").exists()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)


def test_an_injected_enospc_names_the_option_and_the_final_path(
    tmp_path, inputs, capsys, monkeypatch
):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    d = tmp_path / "out"
    with OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "old")
    old = _state(d)
    monkeypatch.setattr(sio.os, "fsync", full)
    assert main(["simulate", str(inputs / "tiny.yaml"), "--out", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"moesim: error: --out {d}/") and ".moesim-" not in err, err
    assert err.rstrip().endswith(": cannot write (No space left on device)"), err
    assert _state(d) == old
    for argv, option in (
        (["graph", str(inputs / "tiny.yaml"), "-o"], "-o/--output"),
        (
            [
                "collectives",
                "--topology",
                "dgx-a100",
                "--nodes",
                "1",
                "-b",
                "1K",
                "-e",
                "2K",
                "--out",
            ],
            "--out",
        ),
        (["topology", "show", "dgx-a100", "--draw"], "--draw"),
    ):
        target = tmp_path / "f.out"
        assert main([*argv, str(target)]) == 2
        err = capsys.readouterr().err.splitlines()[-1]
        assert err == (
            f"moesim: error: {option} {target}: cannot write (No space left on device)"
        ), err
        assert list(tmp_path.glob(".*.tmp")) == []


def test_a_reader_finishes_a_committed_swap(tmp_path):
    """Killed just after the commit, before moving anything: the next reader of the folder
    (`moesim report` / `replay` through check_set) finds the new set whole."""
    from sim.analysis.output_sets import check_set

    d = tmp_path / "out"
    with OutputSet(d, "compare") as out:
        out.write_text("results.csv", "old")
        out.write_text("old-only.md", "old")

    def new():
        def die(*a):
            os.kill(os.getpid(), signal.SIGKILL)

        sio._roll_forward = die
        with OutputSet(d, "compare") as out:
            out.write_text("results.csv", "new")
        return 0

    assert os.WIFSIGNALED(_fork(new, 0))
    assert not (d / MANIFEST).exists() or (d / "results.csv").read_text() == "old"
    check_set(d, "report input", "results.csv")
    assert (d / "results.csv").read_text() == "new" and not (d / "old-only.md").exists()
    assert _state(d)[1] == ["results.csv"]
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []
