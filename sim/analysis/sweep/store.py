"""A sweep's output directory: one Parquet part per finished run, resumable, then the results.

    OUT/sweep.json         the spec it was started with (its fingerprint, the normalised spec)
    OUT/rows/<run_id>.parquet   one row per finished run, written atomically as it finishes
    OUT/results.parquet, results.csv, manifest.json   every row in the spec's order, as a set

A part is written to a temporary file and renamed, so after a kill a part is whole or absent
and a run_id is in at most one part: a restart runs exactly the points without one. A sweep
of another spec is refused in the same directory unless `restart` discards the old rows. A
lock (flock) keeps two sweeps from writing into one directory at the same time; the kernel
drops it when its process dies, even by SIGKILL.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.sweep.run import BOOL_COLUMNS, COLUMNS, FLOAT_COLUMNS, INT_COLUMNS
from sim.analysis.sweep.spec import Sweep, text
from sim.core.dirlock import lock_dir
from sim.core.errors import ConfigError
from sim.core.io import (
    OutputSet,
    atomic_write_bytes,
    atomic_write_text,
    check_output_dir,
)

STATE = "sweep.json"
ROWS = "rows"
LOCK = ".sweep.lock"


class Store:
    def __init__(self, out: str | Path, sweep: Sweep, restart: bool = False):
        self.dir = check_output_dir(out, "--out")
        self.sweep = sweep
        self.rows = self.dir / ROWS
        self.lock_fd = lock_dir(
            self.dir, LOCK, f"--out {self.dir}: another sweep is writing there now"
        )
        try:
            self._open(sweep, restart)
        except BaseException:
            self.close()
            raise

    def _open(self, sweep: Sweep, restart: bool) -> None:
        state = self._state()
        if state is not None and state.get("fingerprint") != sweep.fingerprint:
            if not restart:
                raise ConfigError(
                    f"--out {self.dir}: holds a sweep of another spec ({state.get('source')}, "
                    f"started {state.get('started')}); give another --out, or --restart to "
                    "discard its rows"
                )
            self._discard()
            state = None
        if state is None:
            self.rows.mkdir(exist_ok=True)
            for part in self.rows.glob("*.parquet"):  # a --restart's or a foreign leftover
                part.unlink()
            doc = {
                "fingerprint": sweep.fingerprint,
                "source": sweep.source,
                "name": sweep.name,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "points": len(sweep.points),
                "keys": sweep.keys,
                "spec": sweep.spec,
            }
            atomic_write_text(
                self.dir / STATE, json.dumps(doc, indent=2, default=str) + "\n", "--out"
            )
        self.rows.mkdir(exist_ok=True)
        for tmp in self.rows.glob(".*.tmp"):  # parts a killed run was writing
            tmp.unlink(missing_ok=True)

    def _state(self) -> dict[str, Any] | None:
        from sim.core.safeload import load_json

        path = self.dir / STATE
        if not path.exists():
            if any(self.rows.glob("*.parquet")) if self.rows.is_dir() else False:
                raise ConfigError(f"--out {self.dir}: has {ROWS}/ but no {STATE}: not a sweep's")
            return None
        doc = load_json(path, "sweep state")
        return doc if isinstance(doc, dict) else {}

    def _discard(self) -> None:
        for part in self.rows.glob("*.parquet") if self.rows.is_dir() else ():
            part.unlink()
        (self.dir / STATE).unlink(missing_ok=True)

    def done(self, retry_errors: bool = False) -> set[str]:
        """run_ids with a row (with `retry_errors`: with an ok row; error rows are re-run)."""
        wanted = {p.run_id for p in self.sweep.points}
        ids = {p.stem for p in self.rows.glob("*.parquet")} & wanted
        if retry_errors:
            ids = {i for i in ids if _read_part(self.rows / f"{i}.parquet")["status"][0] == "ok"}
        return ids

    def write(self, row: dict[str, Any]) -> Path:
        """One finished run's row, atomically (temporary file, fsync, rename)."""
        buf = io.BytesIO()
        frame([row], self.sweep).to_parquet(buf, index=False)
        path = self.rows / f"{row['run_id']}.parquet"
        atomic_write_bytes(path, buf.getvalue(), "--out")  # errors name the option
        return path

    def results(self) -> pd.DataFrame:
        """Every row there is, in the spec's order."""
        order = {p.run_id: p.index for p in self.sweep.points}
        parts = [_read_part(f) for f in self.rows.glob("*.parquet") if f.stem in order]
        rows = [r for df in parts for r in df.to_dict(orient="records")]
        rows.sort(key=lambda r: order[r["run_id"]])
        return frame(rows, self.sweep)

    def consolidate(self) -> tuple[pd.DataFrame, dict[str, Path]]:
        """results.parquet and results.csv written as one output set (manifest last)."""
        df = self.results()
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        with OutputSet(self.dir, "sweep") as out:
            files = {
                "parquet": out.write_bytes("results.parquet", buf.getvalue()),
                "csv": out.write_text("results.csv", df.to_csv(index=False)),
            }
        return df, files

    def close(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _read_part(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def param_column(key: str) -> str:
    return f"param.{key}"


def param_kinds(sweep: Sweep) -> dict[str, str]:
    """Each swept key's column type, from all its values: "int", "float" or "str"."""
    kinds: dict[str, str] = {}
    for key in sweep.keys:
        vals = [p.params[key] for p in sweep.points]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            kinds[key] = "int"
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            kinds[key] = "float"
        else:
            kinds[key] = "str"
    return kinds


def frame(rows: list[dict[str, Any]], sweep: Sweep) -> pd.DataFrame:
    """Rows as the results frame: the shared columns, then `param.<key>`; the same dtypes
    for one row, many, ok and error rows alike."""
    by_id = {p.run_id: p for p in sweep.points}
    kinds = param_kinds(sweep)
    full = []
    for r in rows:
        r = {c: r.get(c) for c in COLUMNS}
        params = by_id[r["run_id"]].params
        for key, kind in kinds.items():
            v = params[key]
            r[param_column(key)] = text(v) if kind == "str" else v
        full.append(r)
    cols = list(COLUMNS) + [param_column(k) for k in kinds]
    df = pd.DataFrame(full, columns=cols)
    for c in FLOAT_COLUMNS:
        df[c] = df[c].astype("float64")
    for c in INT_COLUMNS:
        df[c] = df[c].astype("Int64")
    for c in BOOL_COLUMNS:
        df[c] = df[c].astype("boolean")
    for key, kind in kinds.items():
        col = param_column(key)
        df[col] = df[col].astype({"int": "int64", "float": "float64", "str": str}[kind])
    return df
