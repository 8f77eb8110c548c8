"""Work run on local processes or a Dask cluster, results in the order they finish: the
plumbing `moesim sweep` and `moesim plan` share.

    for got in stream(fn, items, scheduler=None, workers=4, name=str):
        if got is None:      # a heartbeat: nothing finished for HEARTBEAT_S
            continue
        item, result = got

`scheduler`: a Dask scheduler address, a `distributed.Client`, or `dask-local` (a local
Dask cluster of `workers` processes, started and stopped here); else `workers` local
processes (1: in this process). `fn` and the items must pickle (Dask: `sim` installed on
the workers; no shared file system is needed, the caller writes the results).

`lazy`: items are pulled from the iterable only as slots free up (as many in flight as
the pool runs at once), so a caller can decide what to run next from the results so far
(`moesim plan` skips candidates its best step has ruled out); else every item is submitted
at once (`moesim sweep`). A lazy iterable may yield `WAIT`: nothing to run until a result
in flight comes back (`moesim plan` ranks its candidates once all of them are screened);
it is asked again after the next result.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from sim.core.errors import ConfigError, MoesimError

T = TypeVar("T")
R = TypeVar("R")

# While nothing finishes, the stream yields None this often, so a progress bar redraws its
# elapsed time and says what it waits for (a Dask cluster's first result can take a minute).
HEARTBEAT_S = 0.5
ORPHAN_POLL_S = 0.5  # how often a worker looks whether its parent is still there
LOCAL_DASK = "dask-local"  # --scheduler value: a Dask cluster of local processes

Got = tuple[Any, Any] | None


class _Wait:
    def __repr__(self) -> str:
        return "WAIT"


WAIT: Any = _Wait()  # a lazy iterable's "nothing yet" (see the module docstring)


_END: Any = object()


def take(items: Iterator[Any], n: int, running: int = 1, what: str = "work") -> list[Any]:
    """Up to `n` items of a lazy iterable: fewer where it ends or says WAIT; with nothing
    `running`, a WAIT is a stall (the iterable waits for results that cannot come)."""
    out: list[Any] = []
    while len(out) < n:
        x = next(items, _END)
        if x is _END:
            break
        if x is WAIT:
            if not out and not running:
                raise _stalled(what)
            break
        out.append(x)
    return out


def _stalled(what: str) -> MoesimError:
    return MoesimError(f"{what}: the work waits for results with nothing running (a bug)")


def stream(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    scheduler: Any = None,
    workers: int | None = None,
    close_fds: list[int] | None = None,
    name: Callable[[T], str] = str,
    lazy: bool = False,
    killed: Callable[[T, Exception], R] | None = None,
    what: str = "work",
    resume: str = "run the same command again to resume",
) -> Iterator[tuple[T, R] | None]:
    """(item, fn(item)) in the order they finish, None every HEARTBEAT_S while none does.

    Local worker processes are started here, before this returns (a caller's progress bar
    starts its thread after: forking a threaded process can deadlock). `close_fds`:
    descriptors a forked worker closes (an output directory's lock: a worker outliving a
    killed parent must not hold it). `name(item)`: the item's Dask key (unique per item).
    `killed(item, error)`: the result of an item that killed its Dask workers every time it
    ran (None: that ends the stream like any other failure of the machinery). `what`,
    `resume`: the words of the error that ends the stream when a worker is lost."""
    fail = _Failure(killed, what, resume)
    if scheduler is not None:
        return _on_dask(fn, iter(items), scheduler, workers, name, lazy, fail)
    if workers is not None and workers <= 1:
        return _in_process(fn, iter(items), what)
    if not lazy:
        listed = list(items)
        n = min(workers or os.cpu_count() or 1, len(listed))
        if n <= 1:
            return _in_process(fn, iter(listed), what)
        items = listed
    else:
        n = workers or os.cpu_count() or 1
    return _on_processes(fn, iter(items), n, close_fds or [], lazy, fail)


def _in_process(fn: Callable[[Any], Any], items: Iterator[Any], what: str) -> Iterator[Got]:
    """Each item run here, its result yielded before the next is asked for (so a lazy
    iterable never has to WAIT: nothing is in flight)."""
    for item in items:
        if item is WAIT:
            raise _stalled(what)
        yield item, fn(item)


class _Failure:
    def __init__(self, killed: Callable[[Any, Exception], Any] | None, what: str, resume: str):
        self.killed, self.what, self.resume = killed, what, resume

    def result(self, fut: Any, item: Any) -> Any:
        """A finished future's result. An item that killed its Dask workers every time it ran
        is that item's `killed` result; any other failure of the machinery (a local worker
        process killed or out of memory, a lost scheduler) ends the work with the results
        so far kept: which item was to blame is unknown."""
        try:
            return fut.result()
        except Exception as e:
            if type(e).__name__ != "KilledWorker" or self.killed is None:
                if isinstance(e, MoesimError):
                    raise
                raise MoesimError(
                    f"{self.what} stopped: {type(e).__name__}: {e} (a worker process killed "
                    f"or out of memory? the results so far are kept: {self.resume}; "
                    "--workers 1 runs in this process)"
                ) from None
            return self.killed(item, e)


def _on_processes(
    fn: Callable[[Any], Any],
    items: Iterator[Any],
    n: int,
    close_fds: list[int],
    lazy: bool,
    fail: _Failure,
) -> Iterator[Got]:
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
    first = take(items, n, 0, fail.what) if lazy else items
    pool = ProcessPoolExecutor(
        n, mp_context=mp.get_context(method), initializer=_init_worker, initargs=(inherited,)
    )
    # the first ones submitted now, so that the workers exist before a progress bar starts
    # its thread
    futures = {pool.submit(fn, item): item for item in first}
    return drain(pool, futures, items if lazy else None, fail, fn, n)


def _init_worker(fds: list[int]) -> None:
    """A worker closes `fds` and ends when its parent does. A pool's worker blocks on a
    queue that its siblings also hold open, so a killed parent (SIGKILL: no clean-up) left
    them running for minutes. The parent is the caller (fork, spawn) or the forkserver,
    which exits with it; a thread sees the change of parent within ORPHAN_POLL_S. (Polling,
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

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def drain(
    pool: Any,
    futures: dict[Any, Any],
    more: Iterator[Any] | None = None,
    fail: _Failure | None = None,
    fn: Callable[[Any], Any] | None = None,
    slots: int = 1,
) -> Iterator[Got]:
    """(item, result) of `futures` ({future: item}) as they finish, None every HEARTBEAT_S
    while none does; with `more`, items of it submitted to `pool` (`fn(item)`) as each one
    finishes, after its result is yielded (the caller's view of it decides what comes
    next), until `slots` are in flight or `more` says WAIT."""
    from concurrent.futures import FIRST_COMPLETED, wait

    fail = fail or _Failure(None, "work", "run it again")
    try:
        left = set(futures)
        while left:
            finished, left = wait(left, timeout=HEARTBEAT_S, return_when=FIRST_COMPLETED)
            if not finished:
                yield None
            back = list(finished)
            for i, fut in enumerate(back):
                item = futures.pop(fut)
                yield item, fail.result(fut, item)
                if more is not None and fn is not None:
                    # in flight, or back and still to be told: what a WAIT waits for
                    running = len(left) + len(back) - i - 1
                    for nxt in take(more, max(1, slots - len(left)), running, fail.what):
                        new = pool.submit(fn, nxt)
                        futures[new] = nxt
                        left.add(new)
    except BaseException:  # interrupted: the queued items are dropped, running ones end
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _on_dask(
    fn: Callable[[Any], Any],
    items: Iterator[Any],
    scheduler: Any,
    workers: int | None,
    name: Callable[[Any], str],
    lazy: bool,
    fail: _Failure,
) -> Iterator[Got]:
    yield None  # a caller's bar is up before the connection, which may take seconds
    try:
        import distributed
    except ImportError:
        raise ConfigError(
            "--scheduler: needs the dask extra (pip install 'moesim[dask]')"
        ) from None
    dist: Any = distributed  # untyped: its calls are Any here
    Client, wait = dist.Client, dist.wait
    cluster = None
    own = not isinstance(scheduler, Client)
    if own and scheduler == LOCAL_DASK:
        n = workers or os.cpu_count() or 1
        cluster = dist.LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
        )
        scheduler = cluster.scheduler_address
    if own:
        try:
            client = Client(scheduler, timeout="20s")
        except Exception as e:  # noqa: BLE001 - whatever answered there, it is not usable
            # (a server that is not a Dask scheduler answers the handshake with bytes that
            # distributed reads as a frame length: a MemoryError of exabytes, not a refusal)
            if cluster is not None:
                cluster.close()
            why = (
                str(e)
                if isinstance(e, (OSError, TimeoutError, ValueError))
                else (f"not a Dask scheduler? {type(e).__name__} in the handshake")
            )
            raise ConfigError(f"--scheduler {scheduler}: cannot connect ({why})") from None
    else:
        client = scheduler
    try:
        # keys of this call only: a client's earlier futures of the same items never answer
        tag = uuid.uuid4().hex[:8]
        by_key: dict[Any, Any] = {}

        def submit(batch: Iterable[Any]) -> list[Any]:
            batch = list(batch)
            keys = [f"moesim-{name(x)}-{tag}" for x in batch]
            futs = client.map(fn, batch, pure=False, key=keys) if batch else []
            by_key.update({f.key: x for f, x in zip(futs, batch)})
            return futs

        def slots() -> int:  # threads of the cluster's workers now (workers may join late)
            return max(1, int(sum(client.nthreads().values())))

        left = set(submit(take(items, slots(), 0, fail.what) if lazy else items))
        while left:
            try:
                finished, left = wait(left, timeout=HEARTBEAT_S, return_when="FIRST_COMPLETED")
            except TimeoutError:  # distributed's wait raises where concurrent's returns
                yield None
                continue
            back = list(finished)
            for i, fut in enumerate(back):
                item = by_key.pop(fut.key)
                yield item, fail.result(fut, item)
                if lazy:
                    running = len(left) + len(back) - i - 1
                    n = max(1, slots() - len(left))
                    left.update(submit(take(items, n, running, fail.what)))
    finally:
        if own:
            client.close()
        if cluster is not None:
            cluster.close()
