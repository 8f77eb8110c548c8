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

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.sweep.run import error_fields, run_point
from sim.analysis.sweep.spec import Point, load
from sim.analysis.sweep.store import Store, frame
from sim.core.errors import ConfigError, MoesimError

Row = dict[str, Any]
# While no run finishes, the result streams yield None this often, so the bar redraws its
# elapsed time and says what it waits for (a Dask cluster's first result can take a minute:
# the sweep looked hung).
HEARTBEAT_S = 0.5
ORPHAN_POLL_S = 0.5  # how often a worker looks whether the sweep is still there


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
    `scheduler`: a Dask scheduler address (or a `distributed.Client`) to run on; else
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
    does. `close_fds`: descriptors a forked worker closes (the output directory's lock: a
    worker outliving a killed sweep must not hold it)."""
    if not points:
        return iter(())
    if scheduler is not None:
        return _on_dask(points, scheduler)
    n = min(workers or os.cpu_count() or 1, len(points))
    if n == 1:
        return (run_point(p) for p in points)
    return _on_processes(points, n, close_fds)


def _on_processes(points: list[Point], n: int, close_fds: list[int]) -> Iterator[Row | None]:
    import multiprocessing as mp
    import threading
    from concurrent.futures import ProcessPoolExecutor

    # fork where this process has no other thread (workers start with sim imported: no
    # second start-up), forkserver otherwise (forking a threaded process can deadlock)
    methods = mp.get_all_start_methods()
    method = "fork" if "fork" in methods and threading.active_count() == 1 else None
    method = method or ("forkserver" if "forkserver" in methods else "spawn")
    # only a forked worker has the parent's descriptors (in another, the number is another's)
    inherited = close_fds if method == "fork" else []
    pool = ProcessPoolExecutor(
        n, mp_context=mp.get_context(method), initializer=_init_worker, initargs=(inherited,)
    )
    # submitted now, so that the workers exist before a progress bar starts its thread
    futures = {pool.submit(run_point, p): p for p in points}
    return _drain(pool, futures)


def _init_worker(fds: list[int]) -> None:
    """A worker closes `fds` and ends when its parent does. A pool's worker blocks on a
    queue that its siblings also hold open, so a killed sweep (SIGKILL: no clean-up) left
    them running for minutes. The parent is the sweep (fork, spawn) or the forkserver, which
    exits with the sweep; a thread sees the change of parent within ORPHAN_POLL_S. (Polling,
    not prctl(PR_SET_PDEATHSIG): that is Linux-only; not a pipe: a forked sibling inherits
    its write end and keeps it open.)"""
    import contextlib
    import threading

    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    parent = os.getppid()

    def watch() -> None:
        import time

        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="watch-sweep", daemon=True).start()


def _drain(pool: Any, futures: dict[Any, Point]) -> Iterator[Row | None]:
    from concurrent.futures import FIRST_COMPLETED, wait

    try:
        left = set(futures)
        while left:
            finished, left = wait(left, timeout=HEARTBEAT_S, return_when=FIRST_COMPLETED)
            if not finished:
                yield None
            for fut in finished:
                yield _result(fut, futures[fut])
    except BaseException:  # interrupted: the queued points are dropped, running ones end
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _on_dask(points: list[Point], scheduler: Any) -> Iterator[Row | None]:
    yield None  # the bar is up before the connection, which may take seconds
    try:
        from distributed import Client, wait
    except ImportError:
        raise ConfigError(
            "--scheduler: needs the dask extra (pip install 'moesim[dask]')"
        ) from None
    own = not isinstance(scheduler, Client)
    if own:
        try:
            client = Client(scheduler, timeout="20s")
        except (OSError, TimeoutError, ValueError) as e:
            raise ConfigError(f"--scheduler {scheduler}: cannot connect ({e})") from None
    else:
        client = scheduler
    try:
        # keys of this call only: a client's earlier futures of the same points never answer
        token = uuid.uuid4().hex[:8]
        names = [f"moesim-{p.run_id}-{token}" for p in points]
        futures = client.map(run_point, points, pure=False, key=names)
        by_key = {f.key: p for f, p in zip(futures, points)}
        left = set(futures)
        while left:
            try:
                finished, left = wait(left, timeout=HEARTBEAT_S, return_when="FIRST_COMPLETED")
            except TimeoutError:  # distributed's wait raises where concurrent's returns
                yield None
                continue
            for fut in finished:
                yield _result(fut, by_key[fut.key])
    finally:
        if own:
            client.close()


def _result(fut: Any, point: Point) -> Row:
    """A finished future's row. A point that killed its Dask workers every time it ran is that
    point's error row; any other failure of the machinery (a local worker process killed or
    out of memory, a lost scheduler) ends the sweep with the rows so far kept: which point
    was to blame is unknown, and a resume runs the rest."""
    try:
        return fut.result()
    except Exception as e:
        if type(e).__name__ != "KilledWorker":
            raise MoesimError(
                f"sweep stopped: {type(e).__name__}: {e} (a worker process killed or out of "
                "memory? the rows written so far are kept: run the same command again to "
                "resume; --workers 1 runs in this process)"
            ) from None
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
