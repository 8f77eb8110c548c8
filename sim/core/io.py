"""File output: atomic writes (a reader never sees a half-written file) and output sets
(a run's files staged, then swapped in whole with a manifest, so a reader never sees a mixed
set and a failed run never costs the previous one)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; results are for sharing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- outputs as one set -----------------------------------------------------------------------

MANIFEST = "manifest.json"
_MAX_NAME = 255  # bytes in one path component on the file systems we write to


def check_output_dir(path: str | Path, what: str = "--out") -> Path:
    """Fail before a run, in one line, if its output directory cannot be used: an existing
    non-directory, a parent that is a file or not writable, a name too long."""
    from sim.core.errors import ConfigError

    p = Path(path)
    if str(path) == "":
        raise ConfigError(f"{what}: expected a directory path, got ''")
    for part in p.parts:
        if len(os.fsencode(part)) > _MAX_NAME:
            raise ConfigError(f"{what} {p}: the name {part[:40]!r}... is over {_MAX_NAME} bytes")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {p}: exists and is not a directory")
    existing = p
    while not existing.exists():  # the nearest existing ancestor must be a writable directory
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} {p}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {p}: {existing} is not writable")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".probe.", suffix=".tmp"):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot write there ({e.strerror or e})") from None
    return p


STAGE_PREFIX = ".moesim-new-"  # + pid + "-": a set being written (sim.core.io.OutputSet)
_OPEN: set[Path] = set()  # this process's sets still being written


class OutputSet:
    """The files of one run, written as a set that appears whole or not at all.

    The new files are written into a hidden staging folder inside the output directory (same
    file system, so moving them in is a rename). Only when the set is complete (`close`)
    does it replace the previous one: the old manifest goes first (a crash from there on
    leaves no manifest, so the folder reads as partial, never as a mixed set), the old
    files the new set does not rewrite are removed, the new files are renamed in, and
    `manifest.json` comes last, naming every file with its size and SHA-256. A run that
    fails, is interrupted or fills the disk before then leaves the previous set as it was;
    a killed one leaves a staging folder that the next set opened there removes. Files in
    the directory that no manifest lists are never touched."""

    def __init__(self, out_dir: str | Path, kind: str, what: str = "--out"):
        self.dir = check_output_dir(out_dir, what)
        self.kind = kind
        self.files: list[str] = []
        _remove_stale(self.dir)
        self.stage = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=self.dir))
        _OPEN.add(self.stage)

    def path(self, name: str) -> Path:
        """Where file `name` is written now (in the staging folder); the caller writes it
        atomically, and it is in the set. `final(name)` is where it will be."""
        if Path(name).is_absolute() or ".." in Path(name).parts or name in ("", MANIFEST):
            raise ValueError(f"output set: {name!r} is not a file name inside the set")
        if name not in self.files:
            self.files.append(name)
        (self.stage / name).parent.mkdir(parents=True, exist_ok=True)
        return self.stage / name

    def final(self, name: str) -> Path:
        return self.dir / name

    def write_text(self, name: str, text: str) -> Path:
        atomic_write_text(self.path(name), text)
        return self.final(name)

    def write_bytes(self, name: str, data: bytes) -> Path:
        atomic_write_bytes(self.path(name), data)
        return self.final(name)

    def close(self) -> Path:
        import hashlib
        import json
        import shutil
        import time

        entries = {}
        for name in self.files:
            data = (self.stage / name).read_bytes()
            entries[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {
            "kind": self.kind,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": entries,
        }
        atomic_write_text(self.stage / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        # the new set is complete on disk: only now does the old one go
        old = _listed(self.dir)
        (self.dir / MANIFEST).unlink(missing_ok=True)
        for name in old - set(self.files):
            (self.dir / name).unlink(missing_ok=True)
        for name in self.files:
            (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.stage / name, self.dir / name)
        os.replace(self.stage / MANIFEST, self.dir / MANIFEST)
        shutil.rmtree(self.stage, ignore_errors=True)
        _OPEN.discard(self.stage)
        return self.dir / MANIFEST

    def abort(self) -> None:
        """Drop what was written; the previous set stays as it was."""
        import shutil

        shutil.rmtree(self.stage, ignore_errors=True)

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _listed(d: Path) -> set[str]:
    """The files the manifest in `d` names (inside `d` only), or none."""
    import json

    try:
        listed = json.loads((d / MANIFEST).read_text()).get("files", {})
    except (ValueError, OSError, AttributeError):
        return set()
    names = set()
    for name in listed if isinstance(listed, dict) else ():
        f = (d / str(name)).resolve()
        if f.is_relative_to(d.resolve()) and f != d.resolve():
            names.add(str(name))
    return names


def _remove_stale(d: Path) -> None:
    """Staging folders of killed runs (their process is gone) and hidden temporary files a
    killed atomic write left."""
    import shutil

    for tmp in d.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    for stage in d.glob(f"{STAGE_PREFIX}*"):
        pid = stage.name[len(STAGE_PREFIX) :].split("-", 1)[0]
        if stage in _OPEN or not stage.is_dir():
            continue
        if not (pid.isdigit() and _alive(int(pid))):
            shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, but not open (a set dropped without close or abort)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


def verify_set(out_dir: str | Path) -> list[str]:
    """What is wrong with an output set: no manifest, missing or changed files."""
    import hashlib
    import json

    d = Path(out_dir)
    m = d / MANIFEST
    if not m.is_file():
        return [f"{d}: no {MANIFEST}: a partial set (the run did not finish) or not an output set"]
    try:
        files = json.loads(m.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError):
        return [f"{m}: unreadable manifest"]
    problems = []
    for name, entry in files.items():
        f = d / name
        if not f.is_file():
            problems.append(f"{f}: listed in the manifest but missing")
        elif hashlib.sha256(f.read_bytes()).hexdigest() != entry.get("sha256"):
            problems.append(f"{f}: changed since the run wrote it (a mixed set)")
    return problems
