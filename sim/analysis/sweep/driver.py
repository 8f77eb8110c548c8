"""`moesim sweep`: the cross product of a spec's values, run in local worker processes or on a
Dask distributed cluster, one results row per run written as it finishes, resumable.

    df = run_sweep("sweep.yaml", out="out/sweep")                  # local processes
    df = run_sweep("sweep.yaml", out="out/sweep", scheduler="tcp://head:8786")   # Dask

The same function (`sim.analysis.sweep.run.run_point`) runs every point wherever it runs;
it returns the row and the driver writes it (`sim.analysis.sweep.store`), so workers need
`sim` installed but no shared file system. Every point is validated before the first run
(`sim.analysis.sweep.spec`); a point whose run fails is a row with status "error".
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.sweep.run import error_fields, run_point
from sim.analysis.sweep.spec import Point, load
from sim.analysis.sweep.store import Store, frame
from sim.core import pool
from sim.core.errors import ConfigError

Row = dict[str, Any]


def run_sweep(
    spec_or_path: Any,
    out: str | Path | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    progress: bool = False,
    restart: bool = False,
    retry_errors: bool = False,
    stats: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Run a sweep (a spec file path, a mapping or a loaded Sweep) and return its results,
    one row per point in the spec's order.

    `out`: the directory of the rows and results (None: nothing written, nothing resumed);
    with rows there from an interrupted run of the same spec, only the missing points run.
    `scheduler`: a Dask scheduler address (or a `distributed.Client`, or `dask-local`: a
    Dask cluster of `workers` local processes) to run on; else
    `workers` local processes (default: the CPU count; 1 runs in this process).
    `restart`: discard an `out` of another spec instead of refusing it. `retry_errors`:
    re-run the points whose row is an error. `progress`: a bar on stderr. `stats`, if given,
    receives the counts (points, skipped, ran, failed) and the files written."""
    sweep = load(spec_or_path)
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ConfigError(f"--workers: expected a positive integer, got {workers!r}")
    store = Store(out, sweep, restart) if out is not None else None
    try:
        done = store.done(retry_errors) if store is not None else set()
        pending = [p for p in sweep.points if p.run_id not in done]
        rows: list[Row] = []
        failed = 0
        # the workers start before the bar (and its thread); forked ones drop the lock's fd
        keep_out = [store.lock_fd] if store is not None and store.lock_fd is not None else []
        results = _execute(pending, scheduler, workers, keep_out)
        waiting = f"waiting for {scheduler}" if scheduler is not None else "running"
        with _bar(len(sweep.points), len(done), progress, waiting) as tick:
            for row in results:
                if row is None:  # a heartbeat: nothing finished yet
                    tick.beat()
                    continue
                if store is not None:
                    store.write(row)  # before it counts as done: a kill after it loses nothing
                else:
                    rows.append(row)
                failed += row["status"] != "ok"
                tick(row["status"] != "ok")
        if store is not None:
            df, files = store.consolidate()
        else:
            order = {p.run_id: p.index for p in sweep.points}
            df, files = frame(sorted(rows, key=lambda r: order[r["run_id"]]), sweep), {}
    finally:
        if store is not None:
            store.close()
    if stats is not None:
        stats.update(
            points=len(sweep.points),
            skipped=len(done),
            ran=len(pending),
            failed_now=failed,
            failed=int((df["status"] != "ok").sum()),
            files={k: str(v) for k, v in files.items()},
        )
    return df


def _execute(
    points: list[Point], scheduler: Any, workers: int | None, close_fds: list[int]
) -> Iterator[Row | None]:
    """Rows of `points` in the order they finish, and None every HEARTBEAT_S while none
    does (`sim.core.pool`, which `moesim plan` shares). `close_fds`: descriptors a forked
    worker closes (the output directory's lock: a worker outliving a killed sweep must not
    hold it)."""
    if not points:
        return iter(())
    got = pool.stream(
        run_point,
        points,
        scheduler=scheduler,
        workers=workers,
        close_fds=close_fds,
        name=lambda p: p.run_id,
        killed=_killed,
        what="sweep",
        resume="the rows written so far are kept: run the same command again to resume",
    )
    return (None if g is None else g[1] for g in got)


def _killed(point: Point, e: Exception) -> Row:
    """The row of a point that killed its Dask workers every time it ran."""
    base = {"run_id": point.run_id, "config": point.config, "strategy": point.strategy}
    return base | error_fields(f"worker killed every time it ran this point: {e}")


class _bar:
    """tqdm on stderr: runs done of all, failed in this run, done by an earlier one."""

    def __init__(self, total: int, done: int, on: bool, waiting: str = "running"):
        self.total, self.done, self.on = total, done, on
        self.failed = 0
        self.bar: Any = None
        self.waiting = waiting  # what the bar says until the first run finishes
        self.first = True

    def __enter__(self) -> _bar:
        if self.on:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total, initial=self.done, desc="sweep", unit="run", file=sys.stderr
            )
            self.bar.set_postfix_str(self._postfix(), refresh=False)
        return self

    def _postfix(self) -> str:
        if self.first:
            return self.waiting
        resumed = f", {self.done} done before" if self.done else ""
        return f"failed {self.failed}{resumed}"

    def beat(self) -> None:
        """Nothing finished: redraw (elapsed time moves) with what the sweep waits for."""
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.refresh()

    def __call__(self, failed: bool) -> None:
        """One run finished (`failed`: with an error row)."""
        self.first = False
        self.failed += failed
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(self._postfix(), refresh=False)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
