"""The validated-input cache: inputs that passed their schema checks before, remembered, so that
a command run again on the same config and topology imports no pydantic at all.

An input is checked against its pydantic model and then used as it was read: the model's
instance is not kept (`sim.core.schema.check`). What a check yields is therefore a verdict,
the input passes or it gets its one error line, and the verdict is all that is cached, never
data a run reads. `Seen(kind, value)` looks up whether `value` passed the checks of `kind`
before; its key is the sha256 of the kind, of the value (marshalled exactly: types, order and
bits, so 1, 1.0 and true differ, and a value marshal cannot write is never cached) and of the
checking code's fingerprint (`fingerprint`: every module of the `sim` package by path, size
and mtime, as Python's own bytecode cache tells a stale module, with moesim's, Python's and
pydantic's versions), so that any change of a schema re-checks everything. Only a pass is
recorded (`Seen.passed`): a bad input is checked afresh every time and gets its error.
`derived(kind, compute)` keeps plain data computed from the schemas alone (the strategies'
parameter defaults), keyed by the fingerprint.

The command line turns it on (`sim.cli`, for the command's duration: `enable`); the Python
API checks every input as it always has. Where: $MOESIM_CACHE_DIR, else
$XDG_CACHE_HOME/moesim, else ~/.cache/moesim; MOESIM_NO_CACHE=1 turns it off. An entry is a
small JSON file, written atomically, led by the sha256 of its body: one that is unreadable,
damaged or not its key's is ignored and written again; a directory that cannot be written only
means nothing is remembered; a command writes at most MAX_WRITES entries (its own inputs, not
a sweep's points), and the directory keeps at most MAX_ENTRIES (the least recently written go
first). Removing the directory clears the cache.
"""

from __future__ import annotations

import json
import marshal
import os
import sys
from collections.abc import Callable
from contextlib import suppress
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ENV_DIR = "MOESIM_CACHE_DIR"
ENV_OFF = "MOESIM_NO_CACHE"
FORMAT = "moesim input cache 1"  # what an entry holds and how its key is made
# entries one command writes at most: its own config and topology need a few; a sweep's
# thousands of points would only fill the directory
MAX_WRITES = 32
# entries the directory keeps: a command's first write prunes the least recently written
# beyond it (an edit of any module of `sim` re-keys everything, so old entries are dead
# weight that would otherwise pile up over a checkout's life)
MAX_ENTRIES = 4096
_MISSING = object()
_on = False
_writes_left = 0
_memo: dict[tuple[Path, str], Any] = {}  # derived values read or computed in this process


def enable(on: bool = True) -> Callable[[], None]:
    """The cache on (or off) for a command, which may write MAX_WRITES entries; the function
    returned puts it back as it was."""
    global _on, _writes_left
    before = _on, _writes_left
    _on, _writes_left = on, MAX_WRITES

    def undo() -> None:
        global _on, _writes_left
        _on, _writes_left = before

    return undo


def directory() -> Path | None:
    """Where entries live; None where the cache is off or no home is known."""
    if os.environ.get(ENV_OFF, "") not in ("", "0"):
        return None
    where = os.environ.get(ENV_DIR)
    if where:
        return Path(where)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "moesim"
    try:
        return Path.home() / ".cache" / "moesim"
    except RuntimeError:  # no HOME and no password entry
        return None


@cache
def fingerprint() -> str:
    """The code that checks inputs, as a digest: every module of the `sim` package (path,
    size, mtime), moesim's and Python's versions and pydantic's installed files."""
    import sim

    lines = [FORMAT, f"moesim {sim.__version__}", sys.version, sys.implementation.cache_tag]
    lines += modules(os.path.dirname(os.path.abspath(sim.__file__)))
    for pkg, name in (("pydantic", "version.py"), ("pydantic_core", "__init__.py")):
        lines.append(f"{pkg} {_installed(pkg, name)}")
    return _sha256("\n".join(lines).encode())


def modules(root: str) -> list[str]:
    """Each .py file under `root` (path from it, size, mtime in ns), in a fixed order."""
    out, todo = [], [root]
    while todo:
        d = todo.pop()
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.name.endswith(".py"):
                st = e.stat()
                out.append(f"{e.path[len(root) :]} {st.st_size} {st.st_mtime_ns}")
            elif e.name != "__pycache__" and e.is_dir():
                todo.append(e.path)
    return out


def _installed(pkg: str, name: str) -> str:
    """Path, size and mtime of a file of an installed package (found as `import` would find
    it, on sys.path, without importing it)."""
    for entry in sys.path:
        path = os.path.join(entry or ".", pkg, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        return f"{os.path.abspath(path)} {st.st_size} {st.st_mtime_ns}"
    return "absent"


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def key(kind: str, value: Any) -> str | None:
    """The key of `value` checked as `kind` by the current code; None where the value cannot
    be written exactly (anything but None, bool, int, float, str, bytes, lists, tuples, sets
    and dicts of them) or is nested too deeply, or where the code's modules cannot be listed
    (a package run from a zip file)."""
    try:
        blob = marshal.dumps(value, 2)  # version 2: no back-references, the same bytes each run
        code = fingerprint()
    except (ValueError, RecursionError, OSError):
        return None
    return _sha256(f"{code}\0{kind}\0".encode() + blob)


class Seen:
    """Whether `value` passed the checks of `kind` before (`hit`). Where it did not, the
    caller checks it and, once every check has passed, says so (`passed`)."""

    __slots__ = ("hit", "key", "where")

    def __init__(self, kind: str, value: Any):
        self.where = directory() if _on else None
        self.key = None if self.where is None else key(kind, value)
        self.hit = False
        if self.where is not None and self.key is not None:
            self.hit = _read(self.where, self.key) is True

    def passed(self) -> None:
        if self.where is not None and self.key is not None and not self.hit:
            _write(self.where, self.key, True)
            self.hit = True


def derived(kind: str, compute: Callable[[], T]) -> T:
    """`compute()`, plain data that depends on the schemas alone, kept under the code's
    fingerprint: read back rather than computed where the cache is on and holds it."""
    where = directory() if _on else None
    k = None if where is None else key(kind, None)
    if where is None or k is None:
        return compute()
    value: Any = _memo.get((where, k), _MISSING)
    if value is _MISSING:
        value = _read(where, k)
    if value is _MISSING:
        value = compute()
        if _plain(value):
            _write(where, k, value)
    _memo[where, k] = value
    return value  # type: ignore[no-any-return]


def _plain(value: Any) -> bool:
    """Whether JSON gives `value` back exactly (types included)."""
    t = type(value)
    if value is None or t in (bool, int, str):
        return True
    if t is float:
        return bool(value - value == 0)  # finite
    if t is list:
        return all(_plain(v) for v in value)
    if t is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def _path(d: Path, key: str) -> Path:
    return d / key[:2] / f"{key[2:]}.json"


def _read(d: Path, key: str) -> Any:
    """The value of the entry `key`; _MISSING where there is none, or none that is whole."""
    try:
        data = _path(d, key).read_bytes()
        digest, _, body = data.partition(b"\n")
        if digest.decode() != _sha256(body):
            return _MISSING
        entry = json.loads(body)
    except (OSError, ValueError):
        return _MISSING
    if not isinstance(entry, dict) or entry.get("key") != key:
        return _MISSING
    return entry.get("value", _MISSING)


def _write(d: Path, key: str, value: Any) -> None:
    """The entry `key`, replaced whole (a temporary file renamed over it), or nothing where the
    directory cannot be written, or once the command has written MAX_WRITES."""
    global _writes_left
    if _writes_left <= 0:
        return
    if _writes_left == MAX_WRITES:
        prune(d)
    _writes_left -= 1
    body = json.dumps({"key": key, "value": value}, separators=(",", ":")).encode()
    path = _path(d, key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(_sha256(body).encode() + b"\n" + body)
        os.replace(tmp, path)
    except OSError:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)


def prune(d: Path, keep: int | None = None) -> int:
    """Removes the least recently written entries of `d` beyond `keep` (down to 3/4 of it, so
    that the next commands need not prune again at once); the number removed. Whatever cannot
    be listed or removed is left."""
    keep = MAX_ENTRIES if keep is None else keep
    entries: list[tuple[float, str]] = []
    with suppress(OSError):
        for sub in os.scandir(d):
            if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(sub.path):
                if e.name.endswith(".json"):
                    with suppress(OSError):
                        entries.append((e.stat(follow_symlinks=False).st_mtime, e.path))
    if len(entries) <= keep:
        return 0
    entries.sort()
    removed = 0
    for _, path in entries[: len(entries) - keep * 3 // 4]:
        with suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed
