"""An output is never renamed over a device, FIFO, socket, directory or symbolic link.

As root, `moesim graph cfg.yaml -o /dev/null` used to turn /dev/null into a regular file: the
atomic writer renamed its temporary file over whatever the path was. Now the path is checked
before the run (one line, exit 2, naming the option and the path) and again by the writer.
"""

from __future__ import annotations

import os
import socket
import stat

import pytest
import yaml

from sim.cli import main
from sim.core.errors import ConfigError
from sim.core.io import MANIFEST, OutputSet, atomic_write_text, verify_set
from tests.configs import SMALL


def _nulldev(path) -> None:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"mknod not permitted here ({e})")


def _fifo(path) -> None:
    os.mkfifo(path)


def _socket(path) -> None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
    except OSError as e:  # a path too long for a socket address
        pytest.skip(f"cannot bind a socket there ({e})")
    finally:
        s.close()


def _dir(path) -> None:
    os.mkdir(path)


def _link_to_device(path) -> None:
    _nulldev(path.parent / "nulldev")
    os.symlink("nulldev", path)


def _link_to_file(path) -> None:
    (path.parent / "real.json").write_text("keep")
    os.symlink("real.json", path)


MAKERS = {
    "character device": _nulldev,
    "FIFO": _fifo,
    "socket": _socket,
    "directory": _dir,
    "symbolic link": _link_to_device,
    "link to a file": _link_to_file,
}


def _unchanged(path, kind: str) -> None:
    st = os.lstat(path)
    want = {
        "character device": stat.S_ISCHR,
        "FIFO": stat.S_ISFIFO,
        "socket": stat.S_ISSOCK,
        "directory": stat.S_ISDIR,
        "symbolic link": stat.S_ISLNK,
        "link to a file": stat.S_ISLNK,
    }[kind]
    assert want(st.st_mode), f"{path} was replaced"
    if kind == "link to a file":
        assert (path.parent / "real.json").read_text() == "keep"


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    return p


def _refused(capsys, argv, option, target) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"moesim: error: {option} {target}"), err
    return err


@pytest.mark.parametrize("kind", MAKERS)
def test_graph_output_refuses_a_special_file(tmp_path, capsys, cfg, kind):
    target = tmp_path / "g.json"
    MAKERS[kind](target)
    _refused(capsys, ["graph", str(cfg), "-o", str(target)], "-o/--output", target)
    _unchanged(target, kind)


@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_collectives_out_and_topology_draw_refuse_it(tmp_path, capsys, kind):
    target = tmp_path / "out"
    MAKERS[kind](target)
    argv = ["collectives", "--topology", "dgx-a100", "--nodes", "1", "-c", "all_to_all"]
    _refused(capsys, [*argv, "-b", "1K", "-e", "4K", "--out", str(target)], "--out", target)
    _refused(capsys, ["topology", "show", "dgx-a100", "--draw", str(target)], "--draw", target)
    _unchanged(target, kind)


@pytest.mark.parametrize("kind", MAKERS)
def test_the_atomic_writer_itself_refuses_it(tmp_path, kind):
    """The root check, for writers reached without a CLI check (and for a path swapped
    after the check)."""
    target = tmp_path / "x.json"
    MAKERS[kind](target)
    with pytest.raises(ConfigError) as e:
        atomic_write_text(target, "{}", "--thing")
    assert str(e.value).startswith(f"--thing {target}: is ")
    _unchanged(target, kind)
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def test_a_regular_file_is_still_replaced(tmp_path):
    target = tmp_path / "x.json"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"


@pytest.mark.parametrize("kind", ["character device", "FIFO", "directory"])
def test_an_output_set_refuses_before_touching_the_old_set(tmp_path, kind):
    d = tmp_path / "run"
    with OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "old")
    MAKERS[kind](d / "trace.csv")
    with pytest.raises(ConfigError) as e, OutputSet(d, "simulate") as out:
        out.write_text("summary.json", "new")
        out.write_text("trace.csv", "new")
    assert str(e.value).startswith(f"--out {d / 'trace.csv'}: is ")
    assert verify_set(d) == [] and (d / "summary.json").read_text() == "old"
    assert (d / MANIFEST).is_file()
    _unchanged(d / "trace.csv", kind)
    assert [p for p in os.listdir(d) if p.startswith(".")] == []  # no staging left
