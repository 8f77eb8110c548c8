"""A plan's journal: the simulated candidates of `moesim plan --out DIR`, appended as they
finish, so that a killed plan run again with the same request skips them.

    DIR/candidates.jsonl   one line per simulated candidate:
                           {"fingerprint": F, "key": "tp=1,cp=1,...", "record": {...}}

F is a digest of the request and of everything a candidate's simulation reads besides its
layout: moesim's code and data (`sim/`: the step model, the recipes, the architectures; not
the command line, sweeps and the plan's report),
the system's topology preset and any measured kernels. A line of another fingerprint (an
edited moesim, another request in the same folder) is kept but never read back. Each line
is written whole and flushed to disk before the candidate counts as done; a kill in the
middle of a line leaves a torn last line, cut off when the journal is opened again. A lock
(flock, dropped by the kernel when its process dies, even by SIGKILL) keeps two plans from
writing into one folder at the same time. The plan's results (plan.csv, plan.parquet,
plan.json, plan.html, best.csv) are written beside it as one output set at the end.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from sim.core.dirlock import lock_dir
from sim.core.io import check_output_dir

JOURNAL = "candidates.jsonl"
LOCK = ".plan.lock"


# what cannot change a candidate's record: the command line, the other commands, the plan's
# report and this journal
NOT_READ = (
    "cli",
    "analysis",
    "training/plan_report.py",
    "training/plan_store.py",
    "training/plan_timeline.py",
)


@functools.cache
def _code_digest() -> str:
    """Digest of moesim's code and data files (`sim/` but NOT_READ), read once per process."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(rel == x or rel.startswith(x + "/") for x in NOT_READ):
            continue
        if path.suffix in (".py", ".yaml", ".yml", ".json", ".csv") and path.is_file():
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


def fingerprint(request: dict[str, Any], preset: str) -> str:
    """The digest that keys a request's journal lines (see the module docstring)."""
    from sim.hardware.topology.spec import topologies_dir
    from sim.training.predict import KERNELS

    topo = topologies_dir() / f"{preset}.yaml"
    doc = {
        "request": {k: v for k, v in request.items() if k != "where"},
        "code": _code_digest(),
        "topology": hashlib.sha256(topo.read_bytes()).hexdigest() if topo.is_file() else preset,
        "kernels": KERNELS,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Journal:
    """The records of a fingerprint already in `out` (`get`), and new ones appended (`add`)."""

    def __init__(self, out: str | Path, fp: str, what: str = "--out"):
        self.dir = check_output_dir(out, what)
        self.fp = fp
        self.path = self.dir / JOURNAL
        self.lock_fd = lock_dir(
            self.dir, LOCK, f"{what} {self.dir}: another plan is writing there now"
        )
        self.records: dict[str, dict[str, Any]] = {}
        try:
            self._read()
            self.file: Any = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line torn by a kill: cut off, its candidate runs again
            with open(self.path, "r+b") as f:
                f.truncate(end)
        for line in data[:end].splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("fingerprint") == self.fp:
                rec = doc.get("record")
                if isinstance(doc.get("key"), str) and isinstance(rec, dict):
                    self.records[doc["key"]] = rec

    def get(self, key: str) -> dict[str, Any] | None:
        rec = self.records.get(key)
        return None if rec is None else json.loads(json.dumps(rec))  # a copy of its own

    def add(self, key: str, record: dict[str, Any]) -> None:
        line = json.dumps({"fingerprint": self.fp, "key": key, "record": record}, default=str)
        self.file.write(line + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.records[key] = json.loads(line)["record"]

    def close(self) -> None:
        f = getattr(self, "file", None)
        if f is not None:
            f.close()
            self.file = None
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None
