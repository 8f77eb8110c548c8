"""The validated-input cache (sim.core.inputcache): a config and topology that passed their
checks are not checked again by the command line, so a second `moesim simulate` of them
imports no pydantic, and says exactly what the first said. Only a pass is remembered, under a
key of the input's exact value and the checking code: a changed input or changed code is
checked again, a bad input always gets its one-line error, and a damaged entry or an
unwritable directory only costs the check. (The autouse fixture of tests/conftest.py gives
every test an empty cache directory of its own: MOESIM_CACHE_DIR.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.startup import TINY
from sim.core import inputcache

# A run of `moesim` in a fresh interpreter: its exit status, stdout, stderr and whether it
# imported pydantic (what a check needs, and a checked input does not).
PROBE = (
    "import contextlib, io, sys\n"
    "from sim.cli import main\n"
    "out, err = io.StringIO(), io.StringIO()\n"
    "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
    "    rc = main(sys.argv[1:])\n"
    "import json\n"
    "print(json.dumps({'rc': rc, 'out': out.getvalue(), 'err': err.getvalue(),\n"
    "                  'pydantic': 'pydantic' in sys.modules}))\n"
)


def _moesim(*argv: str, env: dict[str, str] | None = None) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def _summary(run: dict) -> dict:
    """A run's --json summary without what differs from run to run (wall time, paths)."""
    assert run["rc"] == 0, run["err"]
    summary = json.loads(run["out"])
    summary.pop("wall_s")
    summary.pop("files", None)
    return summary


def _entries() -> list[Path]:
    return sorted(Path(os.environ[inputcache.ENV_DIR]).rglob("*.json"))


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(TINY))
    return path


def test_a_checked_run_says_what_an_unchecked_one_says_and_imports_no_pydantic(tiny, tmp_path):
    argv = ("simulate", str(tiny), "--json", "--out", str(tmp_path / "out"))
    off = _moesim(*argv, env={inputcache.ENV_OFF: "1"})
    assert _entries() == [] and off["pydantic"]
    first = _moesim(*argv)  # checks, and remembers the config, the topology and defaults
    assert first["pydantic"] and len(_entries()) == 4  # config, config with options, topology
    again = _moesim(*argv)
    assert not again["pydantic"]
    assert _summary(off) == _summary(first) == _summary(again)
    assert len(_entries()) == 4
    for name in ("trace.csv", "trace.chrome.json", "config.yaml"):
        assert (tmp_path / "out" / name).is_file()


def test_a_changed_input_is_checked_again_and_a_bad_one_refused(tiny, tmp_path):
    assert _moesim("simulate", str(tiny), "--json")["rc"] == 0
    assert not _moesim("simulate", str(tiny), "--json")["pydantic"]
    changed = _moesim("simulate", str(tiny), "--json", "--nodes", "2")
    assert changed["pydantic"] and changed["rc"] == 0
    assert json.loads(changed["out"])["world_size"] == 16
    tiny.write_text(json.dumps({**TINY, "nodes": 0}))  # the same file, now wrong
    bad = _moesim("simulate", str(tiny), "--json")
    assert bad["rc"] == 2 and bad["pydantic"]
    assert bad["err"].count("\n") == 1 and "nodes: must be > 0, got 0" in bad["err"]
    tiny.write_text(json.dumps(TINY))
    bad = _moesim("simulate", str(tiny), "--json", "--param", "algo=5")  # a bad option
    assert bad["rc"] == 2 and "strategy.algo: expected an algorithm name, got 5" in bad["err"]


def test_a_bad_config_is_never_remembered(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(json.dumps({**TINY, "passes": ["fwd", "sideways"], "nodez": 1}))
    for _ in range(2):
        bad = _moesim("simulate", str(cfg), "--json")
        assert bad["rc"] == 2 and bad["pydantic"] and bad["out"] == ""
        assert bad["err"].startswith("moesim: error: ") and bad["err"].count("\n") == 1
        assert "nodez: unknown key (did you mean 'nodes'?)" in bad["err"]
    assert _entries() == []


def test_a_damaged_entry_is_ignored_and_written_again(tiny):
    argv = ("simulate", str(tiny), "--json")
    want = _summary(_moesim(*argv))
    entries = _entries()
    whole = {p: p.read_bytes() for p in entries}
    damaged = [b"", b"garbage", whole[entries[0]][:-7], whole[entries[1]].replace(b"true", b"0")]
    for path, data in zip(entries, damaged * 2):
        path.write_bytes(data)
    run = _moesim(*argv)
    assert run["pydantic"] and _summary(run) == want
    assert {p: p.read_bytes() for p in _entries()} == whole
    assert not _moesim(*argv)["pydantic"]


def test_an_entry_under_another_key_is_not_taken(tiny):
    """An entry moved to another key's file (or a digest collision of the path) is refused:
    an entry holds its own key."""
    argv = ("simulate", str(tiny), "--json")
    _moesim(*argv)
    entries = _entries()
    data = [p.read_bytes() for p in entries]
    for path, other in zip(entries, data[1:] + data[:1]):
        path.write_bytes(other)
    assert _moesim(*argv)["pydantic"]


def test_an_unwritable_cache_directory_only_turns_the_cache_off(tiny, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {inputcache.ENV_DIR: str(blocker / "cache")}  # under a file: never a directory
    for _ in range(2):
        run = _moesim("simulate", str(tiny), "--json", env=env)
        assert run["rc"] == 0 and run["err"] == "" and run["pydantic"]


def test_where_the_cache_lives(monkeypatch, tmp_path):
    monkeypatch.delenv(inputcache.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert inputcache.directory() == tmp_path / "xdg" / "moesim"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: absolute only
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert inputcache.directory() == tmp_path / "home" / ".cache" / "moesim"
    monkeypatch.setenv(inputcache.ENV_DIR, str(tmp_path / "mine"))
    assert inputcache.directory() == tmp_path / "mine"
    monkeypatch.setenv(inputcache.ENV_OFF, "1")
    assert inputcache.directory() is None


def test_the_python_api_checks_every_time(tmp_path):
    """Only the command line turns the cache on: `sim.commands` (and `import sim`) check
    every input as they always have, and remember nothing."""
    from sim import commands

    commands.simulate_config(dict(TINY))
    assert _entries() == []


def test_a_key_is_the_exact_value_and_the_code(monkeypatch):
    keys = {
        inputcache.key("run config", v)
        for v in ({"nodes": 1}, {"nodes": 1.0}, {"nodes": True}, {"nodes": "1"}, {"nodes": [1]})
    }
    assert len(keys) == 5
    assert inputcache.key("topology", {"nodes": 1}) not in keys
    assert inputcache.key("run config", {"nodes": 1}) == inputcache.key("run config", {"nodes": 1})
    assert inputcache.key("x", {"a": object()}) is None  # not written exactly: never cached
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert inputcache.key("x", deep) is None
    monkeypatch.setattr(inputcache, "fingerprint", lambda: "other code")
    assert inputcache.key("run config", {"nodes": 1}) not in keys


def test_code_that_cannot_be_listed_is_never_cached(monkeypatch):
    def unlisted(root):
        raise NotADirectoryError(root)  # as for a package imported from a zip file

    monkeypatch.setattr(inputcache, "modules", unlisted)
    inputcache.fingerprint.cache_clear()
    try:
        assert inputcache.key("run config", {"nodes": 1}) is None
        undo = inputcache.enable()
        try:
            seen = inputcache.Seen("run config", {"nodes": 1})
            seen.passed()
            assert not seen.hit and _entries() == []
        finally:
            undo()
    finally:
        inputcache.fingerprint.cache_clear()


def test_changed_code_checks_again(tiny, monkeypatch, capsys):
    """In one process, as tests call `main`: a new fingerprint misses every entry."""
    import sim.core.schema as schema
    from sim.cli import main

    checked: list[str] = []
    real = schema.check

    def counted(model, raw, source, *args, **kwargs):
        checked.append(source)
        return real(model, raw, source, *args, **kwargs)

    monkeypatch.setattr(schema, "check", counted)
    assert main(["simulate", str(tiny), "--json"]) == 0
    assert len(checked) == 3  # the config, with the command's options, and the topology
    assert main(["simulate", str(tiny), "--json"]) == 0
    assert len(checked) == 3
    monkeypatch.setattr(inputcache, "fingerprint", lambda: "the schemas changed")
    assert main(["simulate", str(tiny), "--json"]) == 0
    assert len(checked) == 6
    capsys.readouterr()


def test_the_fingerprint_follows_every_module(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("B = 1\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not code\n")
    before = inputcache.modules(str(tmp_path / "pkg"))
    assert [line.split()[0] for line in before] == ["/a.py", "/sub/b.py"]
    b = tmp_path / "pkg" / "sub" / "b.py"
    b.write_text("B = 2\n")  # the same size: the mtime tells
    os.utime(b, ns=(b.stat().st_atime_ns, b.stat().st_mtime_ns + 1))
    assert inputcache.modules(str(tmp_path / "pkg")) != before


def test_the_strategies_defaults_are_their_models(monkeypatch):
    import sim.strategies as strategies

    computed = {s.name: s.defaults for s in strategies.STRATEGY_LIST}
    assert computed["tutel"] == {"degree": 1, "algo": "linear", "parallel": "auto"}
    undo = inputcache.enable()
    try:
        first = {s.name: s.defaults for s in strategies.STRATEGY_LIST}  # computed, written
        inputcache._memo.clear()
        again = {s.name: s.defaults for s in strategies.STRATEGY_LIST}  # read back
    finally:
        undo()
    assert computed == first == again
    assert len(_entries()) == 1


@pytest.mark.parametrize(
    "value, plain",
    [
        ({"a": [1, 2.5, None, True, "x"]}, True),
        ({"a": (1, 2)}, False),
        ({1: "x"}, False),
        ({"a": float("nan")}, False),
        ({"a": {1, 2}}, False),
    ],
)
def test_only_what_json_gives_back_exactly_is_kept(value, plain):
    assert inputcache._plain(value) is plain


def test_a_command_writes_a_bounded_number_of_entries():
    """Its own inputs need a few; a sweep's thousands of points would only fill the disk."""
    undo = inputcache.enable()
    try:
        for i in range(inputcache.MAX_WRITES + 8):
            inputcache.Seen("run config", {"point": i}).passed()
        assert len(_entries()) == inputcache.MAX_WRITES
        assert inputcache.Seen("run config", {"point": 0}).hit
        assert not inputcache.Seen("run config", {"point": inputcache.MAX_WRITES}).hit
    finally:
        undo()
    undo = inputcache.enable()  # the next command writes again
    try:
        inputcache.Seen("run config", {"point": inputcache.MAX_WRITES}).passed()
    finally:
        undo()
    assert len(_entries()) == inputcache.MAX_WRITES + 1


def test_the_directory_keeps_a_bounded_number_of_entries(monkeypatch):
    """A command's first write prunes the least recently written entries beyond MAX_ENTRIES,
    down to 3/4 of it: entries of code since edited would otherwise pile up."""
    monkeypatch.setattr(inputcache, "MAX_ENTRIES", 8)
    for n in range(3):  # three commands of 4 inputs each: 12 entries, written oldest first
        undo = inputcache.enable()
        try:
            for i in range(4):
                inputcache.Seen("run config", {"point": 4 * n + i}).passed()
        finally:
            undo()
        for i, path in enumerate(sorted(_entries(), key=os.path.getmtime)):
            os.utime(path, (1000.0 + i, 1000.0 + i))  # mtimes in write order, whatever the clock
    assert len(_entries()) == 12  # 8 before the third command's first write: no prune yet
    undo = inputcache.enable()
    try:
        inputcache.Seen("run config", {"point": 99}).passed()  # prunes 12 -> 6, then writes
        assert len(_entries()) == 7
        assert inputcache.Seen("run config", {"point": 99}).hit
        assert inputcache.Seen("run config", {"point": 11}).hit  # the newest stay
        assert not inputcache.Seen("run config", {"point": 0}).hit  # the oldest went
    finally:
        undo()
