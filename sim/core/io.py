"""File output: atomic writes (a reader never sees a half-written file) and output sets
(a run's files staged, then swapped in whole with a manifest, so a reader never sees a mixed
set and a failed run never costs the previous one)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from types import TracebackType

from sim.core.errors import ConfigError
from sim.core.safeload import FILE_KINDS


class OutputError(OSError):
    """An output that could not be written (a full disk, a read-only file system): names the
    option and the path the user asked for, never the staging or temporary name."""

    def __init__(self, what: str, path: Path, err: OSError):
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.what = what

    def __str__(self) -> str:
        return f"{self.what} {self.filename}: cannot write ({self.strerror})"


_NAMED: dict[str, str] = {}  # absolute output path -> the option that named it


def name_output(path: str | Path, what: str) -> None:
    """Remember which option named an output file, for the writer's errors."""
    _NAMED[os.path.abspath(path)] = what


def _shown(path: Path) -> tuple[Path, str]:
    """The path the user knows (inside a set's staging folder: its final place) and the
    option that named it."""
    for i, part in enumerate(path.parts):
        if part.startswith(STAGE_PREFIX):
            return Path(*path.parts[:i], *path.parts[i + 1 :]), _OPEN.get(
                Path(*path.parts[: i + 1]), "--out"
            )
    return path, _NAMED.get(os.path.abspath(path), "output file")


def check_replaceable(path: str | Path, what: str) -> None:
    """Refuse, in one line, an output path that holds anything but a regular file.

    A write renames a new file over the path, so a device (`-o /dev/null` as root), FIFO,
    socket or directory there would be replaced, not written to. A symbolic link is refused
    too: renaming over it would silently replace the link and leave its target stale, and
    following it would rename over a file the link's owner chose, which, as root, bypasses
    the kernel's protection against planted links (`protected_symlinks` guards open(), not
    rename()); naming the file itself is unambiguous."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot be checked ({e.strerror or e})") from None
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{what} {p}: is a symbolic link (to {os.readlink(p)}); name the file itself"
        )
    kind = next((k for test, k in FILE_KINDS if test(st.st_mode)), "not a regular file")
    raise ConfigError(f"{what} {p}: is {kind}; only a regular file is replaced by an output")


def atomic_write_text(path: str | Path, text: str, what: str | None = None) -> None:
    atomic_write_bytes(path, text.encode(), what)


def atomic_write_bytes(path: str | Path, data: bytes, what: str | None = None) -> None:
    """`data` at `path`, or nothing there changed. `what` is the option that named the path
    (default: the one `name_output` or an open output set recorded)."""
    path = Path(path)
    shown, named = _shown(path)
    what = what or named
    check_replaceable(path, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputError(what, shown, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; results are for sharing
        check_replaceable(path, what)  # again, just before: the run may have taken hours
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, OutputError):
            raise OutputError(what, shown, e) from None
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


def check_output_file(path: str, what: str) -> None:
    """An output file's path that cannot be written fails before the work, in one line: also
    one that holds a device, FIFO, socket, directory or link, which the write would replace
    (`check_replaceable`). The option is remembered for the writer's errors."""
    if path == "":
        raise ConfigError(f"{what}: expected a file path, got ''")
    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        raise ConfigError(f"{what} {p}: is a directory, expected a file path")
    check_replaceable(p, what)
    check_output_dir(p.parent, what)
    if len(os.fsencode(p.name)) > 255:
        raise ConfigError(f"{what} {p}: the name {p.name[:40]!r}... is over 255 bytes")
    name_output(p, what)


STAGE_PREFIX = ".moesim-new-"  # + pid + "-": a set being written (sim.core.io.OutputSet)
# a complete set being swapped in: a staging folder renamed to this prefix is committed (its
# swap is finished by whoever finds it, `settle_set`); it starts with STAGE_PREFIX so that a
# reader that cannot finish it still sees an unfinished set there
COMMITTED = STAGE_PREFIX + "swap-"
_GONE = ".moesim-remove.json"  # in a committed folder: the old set's files the new one drops
_OPEN: dict[Path, str] = {}  # this process's sets still being written -> their option


class OutputSet:
    """The files of one run, written as a set that appears whole or not at all.

    The new files are written into a hidden staging folder inside the output directory (same
    file system, so moving them in is a rename). Only when the set is complete (`close`)
    does it replace the previous one. The commit point is one rename, of the staging folder
    (with its manifest and the list of old files to drop) to a COMMITTED name: before it
    the old set is untouched; after it the new set is whole on disk, and the swap (old
    manifest out, dropped old files removed, new files renamed in, `manifest.json` last,
    naming every file with its size and SHA-256) is finished by this process or, if it
    was killed, by the next `settle_set` of the folder (a new set opened there, a reader
    through `verify_set`), since each of its steps can be repeated. So the folder holds the
    whole old set or the whole new one, never a mix. A run that fails, is interrupted or
    fills the disk before the commit leaves the previous set as it was; a killed one leaves
    a staging folder that the next set opened there removes. Files in the directory that
    no manifest lists are never touched."""

    def __init__(self, out_dir: str | Path, kind: str, what: str = "--out"):
        self.dir = check_output_dir(out_dir, what)
        self.kind = kind
        self.what = what
        self.files: list[str] = []
        _remove_stale(self.dir)
        try:
            self.stage = Path(
                tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=self.dir)
            )
        except OSError as e:  # a full disk: name the folder asked for, not the staging name
            raise OutputError(what, self.dir, e) from None
        _OPEN[self.stage] = what

    def path(self, name: str) -> Path:
        """Where file `name` is written now (in the staging folder); the caller writes it
        atomically, and it is in the set. `final(name)` is where it will be."""
        if Path(name).is_absolute() or ".." in Path(name).parts or name in ("", MANIFEST):
            raise ValueError(f"output set: {name!r} is not a file name inside the set")
        if name not in self.files:
            self.files.append(name)
        try:
            (self.stage / name).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(self.what, self.final(name), e) from None
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
        import time

        entries = {}
        for name in self.files:
            try:
                data = (self.stage / name).read_bytes()
            except OSError as e:
                raise OutputError(self.what, self.final(name), e) from None
            entries[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {
            "kind": self.kind,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": entries,
        }
        atomic_write_text(self.stage / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        # whatever sits where a new file goes must be replaceable before the old set is
        # touched: a directory there would fail the rename halfway through the swap, and a
        # device or FIFO would be replaced (a link is replaced, not followed: the set's files
        # live in its folder)
        for name in [*self.files, MANIFEST]:
            if not (self.dir / name).is_symlink():
                check_replaceable(self.dir / name, self.what)
        gone = sorted(_listed(self.dir) - set(self.files))
        atomic_write_text(self.stage / _GONE, json.dumps(gone))
        # the commit point: the new set is complete on disk, and from here it is the one
        done = self.dir / (COMMITTED + self.stage.name[len(STAGE_PREFIX) :])
        try:
            os.replace(self.stage, done)
        except OSError as e:
            raise OutputError(self.what, self.dir, e) from None
        _OPEN.pop(self.stage, None)
        self.stage = done  # what abort() would remove, should the swap fail
        try:
            _roll_forward(self.dir, done)
        except KeyboardInterrupt:  # Ctrl-C / SIGTERM mid-swap: the set is committed, finish it
            _roll_forward(self.dir, done)
            raise
        except OSError as e:  # named by where the file goes (a rename's target), not `done`
            where = Path(e.filename2 or e.filename or self.dir)
            if where.is_relative_to(done):
                where = self.dir / where.relative_to(done)
            raise OutputError(self.what, where, e) from None
        return self.dir / MANIFEST

    def abort(self) -> None:
        """Drop what was written; the previous set stays as it was (a committed set that
        failed to swap in is left for `settle_set` to finish: it is the current one)."""
        import shutil

        if not self.stage.name.startswith(COMMITTED):
            shutil.rmtree(self.stage, ignore_errors=True)
        _OPEN.pop(self.stage, None)

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            try:
                self.close()
            except BaseException:
                self.abort()  # refused or failed in the swap: no staging folder left behind
                raise
        else:
            self.abort()


def _listed(d: Path) -> set[str]:
    """The files the manifest in `d` names (inside `d` only), or none."""
    import json

    try:
        listed = json.loads((d / MANIFEST).read_text()).get("files", {})
    except (ValueError, OSError, AttributeError):
        return set()
    return {str(n) for n in (listed if isinstance(listed, dict) else ()) if _inside(d, n)}


def _inside(d: Path, name: object) -> bool:
    """`name` is a path strictly inside `d` (a manifest is input: it may name `../x`)."""
    f = (d / str(name)).resolve()
    return f.is_relative_to(d.resolve()) and f != d.resolve()


def _roll_forward(d: Path, done: Path) -> None:
    """Finish swapping in the committed set in `done`; every step may be repeated, so a
    swap killed halfway is finished by running this again."""
    import json
    import shutil

    new = done / MANIFEST
    if new.is_file():
        files = json.loads(new.read_text())["files"]
        try:
            gone = json.loads((done / _GONE).read_text())
        except (OSError, ValueError):
            gone = []
        (d / MANIFEST).unlink(missing_ok=True)
        for name in gone if isinstance(gone, list) else ():
            f = d / str(name)
            if _inside(d, name) and (f.is_symlink() or f.is_file()):  # never a directory
                f.unlink(missing_ok=True)
        for name in files:
            src = done / name
            if _inside(d, name) and (src.is_file() or src.is_symlink()):  # not moved yet
                (d / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, d / name)
        os.replace(new, d / MANIFEST)
    shutil.rmtree(done, ignore_errors=True)


def settle_set(out_dir: str | Path) -> None:
    """Finish the swap of a set whose writer was killed after committing it (best effort:
    a folder this process may not change is left for `check_set` to refuse)."""
    import contextlib

    d = Path(out_dir)
    for done in sorted(d.glob(f"{COMMITTED}*")):
        if done.is_dir() and not done.is_symlink():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
                _roll_forward(d, done)


def _remove_stale(d: Path) -> None:
    """Staging folders of killed runs (their process is gone) and hidden temporary files a
    killed atomic write left; a committed set a killed run left is swapped in first."""
    import shutil

    settle_set(d)
    for tmp in d.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    for stage in d.glob(f"{STAGE_PREFIX}*"):
        pid = stage.name[len(STAGE_PREFIX) :].split("-", 1)[0]
        if stage in _OPEN or not stage.is_dir() or stage.name.startswith(COMMITTED):
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
    """What is wrong with an output set: no manifest, missing or changed files. A set
    whose swap a killed writer committed is finished first (`settle_set`)."""
    import hashlib
    import json

    d = Path(out_dir)
    settle_set(d)
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
