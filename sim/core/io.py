"""File output: atomic writes (a reader never sees a half-written file) and output sets
(a run's files written as one set with a manifest, so a partial or mixed set is detectable)."""

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


class OutputSet:
    """The files of one run, written as a set.

    Opening the set removes the previous run's manifest and the files it listed (and hidden
    temporary files a killed run left), so files of two runs never sit side by side
    unmarked. Each file is written atomically; closing without error writes `manifest.json`
    last, naming every file with its size and SHA-256. A directory without a manifest, or
    whose files disagree with it, holds a partial or mixed set (`verify_set` says which)."""

    def __init__(self, out_dir: str | Path, kind: str, what: str = "--out"):
        self.dir = check_output_dir(out_dir, what)
        self.kind = kind
        self.files: list[str] = []
        old = self.dir / MANIFEST
        if old.is_file():
            import json

            try:
                listed = json.loads(old.read_text()).get("files", {})
            except (ValueError, OSError, AttributeError):
                listed = {}
            old.unlink()
            for name in listed if isinstance(listed, dict) else ():
                f = self.dir / str(name)
                if f.parent == self.dir and f.is_file():
                    f.unlink()
        for tmp in self.dir.glob(".*.tmp"):  # leftovers of a run killed mid-write
            tmp.unlink(missing_ok=True)

    def path(self, name: str) -> Path:
        """Where file `name` goes; the caller writes it atomically, then it is in the set."""
        if name not in self.files:
            self.files.append(name)
        return self.dir / name

    def write_text(self, name: str, text: str) -> Path:
        atomic_write_text(self.path(name), text)
        return self.dir / name

    def write_bytes(self, name: str, data: bytes) -> Path:
        atomic_write_bytes(self.path(name), data)
        return self.dir / name

    def close(self) -> Path:
        import hashlib
        import json
        import time

        entries = {}
        for name in self.files:
            data = (self.dir / name).read_bytes()
            entries[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {
            "kind": self.kind,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": entries,
        }
        atomic_write_text(self.dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        return self.dir / MANIFEST

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()


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
