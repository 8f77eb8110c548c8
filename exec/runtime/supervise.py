"""The launcher's watch over its rank processes (exec.runtime.launch.call_ranks).

- Start-up is bounded: each rank marks its progress in the run's folder (`rank{r}.up` once its
  interpreter runs, `.torch` once torch is imported, `.ready` once the process group is
  initialised). A rank not ready within the start-up bound (call_ranks: max(--timeout,
  SETUP_TIMEOUT_S)) ends the run, named with the step where it stands, instead of its peers
  waiting in init_process_group (whose gloo timeout is the 24 h control timeout).
- Faults are named: the first rank that died without a report (a signal, an exit code) is the
  cause, and the errors its peers then reported come after it. The launcher's own kills of the
  survivors are never listed.
- Ranks die with the launcher: each rank holds the read end of a pipe whose write end only the
  launcher holds, and a thread in the rank blocks on it. Any death of the launcher, SIGKILL
  included, closes the write end, the read returns, and the rank exits at once. Chosen over
  prctl(PR_SET_PDEATHSIG), which is Linux-only, fires when the launching *thread* ends (a
  launch from a worker thread would lose its ranks) and races a launcher dying before the call;
  the pipe works on every POSIX system, has no start-up race (a closed pipe reads EOF at once),
  and costs no polling. A getppid() check once a second backs it up, for a launcher that
  forked a process holding a copy of the write end.
- SIGTERM, SIGINT and SIGHUP during a launch raise KeyboardInterrupt (as `moesim` does for
  SIGTERM), so the launcher kills its ranks and removes its folder; a folder left by a
  launcher killed with SIGKILL (its pid is in the name) is removed by the next launch.

Only the standard library here: a rank imports this module before torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

PREFIX = "moesim-exec-"
STAGES = ("up", "torch", "ready")
_WHERE = (  # where a rank that reached STAGES[:i] (and not STAGES[i]) stands
    "starting Python",
    "importing torch",
    "connecting to the other ranks (init_process_group)",
)
_GRACE_S = 1.0  # after one rank fails, how long the others get to report their own error
_POLL_S = 0.02


# -- in the rank ---------------------------------------------------------------------------


def watch_parent(fd: int) -> None:
    """End this process as soon as the launcher is gone (see the module's docstring)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            try:
                readable, _, _ = select.select([fd], [], [], 1.0)
            except InterruptedError:  # pragma: no cover - retried by Python itself
                continue
            if readable or os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="watch-launcher", daemon=True).start()


def mark(out: Path, rank: int, stage: str) -> None:
    (out / f"rank{rank}.{stage}").touch()


# -- in the launcher -----------------------------------------------------------------------


def run_folder() -> tempfile.TemporaryDirectory:
    """This launch's folder, named with this process's pid, after removing those of dead
    launchers."""
    remove_stale(Path(tempfile.gettempdir()))
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-")


def remove_stale(root: Path) -> list[Path]:
    """Remove `root`'s launch folders whose launcher (the pid in the name) no longer runs."""
    removed = []
    for d in root.glob(f"{PREFIX}*"):
        pid = d.name[len(PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or a number no pid can be): not ours to judge
    return True


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP raise KeyboardInterrupt while the ranks run (in the main
    thread only: others cannot set handlers), whatever the handlers were; restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    names = ("SIGTERM", "SIGINT", "SIGHUP")
    sigs = [getattr(signal, n) for n in names if hasattr(signal, n)]
    old = {s: signal.signal(s, interrupt) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Supervisor:
    """Waits for the ranks; on a failure says which rank failed first, and how."""

    def __init__(self, procs: list, out: Path, setup_s: float):
        self.procs, self.out, self.setup_s = procs, out, setup_s
        self.t0, self.wall0 = time.monotonic(), time.time()
        self.exits: dict[int, tuple[float, float, int]] = {}  # rank: (after, by, code), wall
        self.late: list[int] = []
        self.stopped: list[int] = []
        self.started = False  # every rank was ready by the start-up bound

    def wait(self) -> bool:
        """Until every rank has exited, or one failed (plus a grace for the others to report
        theirs), or start-up ran out of time. True when the run failed.
        Where someone watches (sim.core.progress), a bar of finished ranks whose elapsed time
        keeps moving, so a run of minutes is never silent."""
        from sim.core import progress

        failed_at: float | None = None
        with progress.Bar(len(self.procs), "exec", "rank") as bar:
            drawn = prev = time.time()
            while True:
                now = time.time()
                codes = [p.poll() for p in self.procs]
                for r, c in enumerate(codes):
                    if c is not None and r not in self.exits:
                        self.exits[r] = (prev, now, c)
                prev = now
                if failed_at is None and (
                    any(c not in (None, 0) for c in codes) or any(self.out.glob("rank*.err"))
                ):
                    failed_at = time.monotonic()
                late = time.monotonic() - self.t0 > self.setup_s
                if late and not self.started and failed_at is None:
                    self.late = self._late(codes)
                    if self.late:
                        self.stopped = [r for r in self.late if _stopped(self.procs[r].pid)]
                        return True
                    self.started = True
                bar.set(sum(c is not None for c in codes))
                if now - drawn >= progress.REFRESH_S:
                    drawn = now
                    bar.refresh()
                if all(c is not None for c in codes):
                    return failed_at is not None
                if failed_at is not None and time.monotonic() - failed_at > _GRACE_S:
                    live = [r for r, c in enumerate(codes) if c is None]
                    self.stopped = [r for r in live if _stopped(self.procs[r].pid)]
                    return True
                time.sleep(_POLL_S)

    def _stage(self, rank: int) -> int:
        return sum((self.out / f"rank{rank}.{s}").exists() for s in STAGES)

    def _late(self, codes: list) -> list[int]:
        """The ranks furthest behind among those not ready (a stopped one first of all)."""
        waiting = [r for r, c in enumerate(codes) if c is None and self._stage(r) < len(STAGES)]
        if not waiting:
            return []
        stopped = [r for r in waiting if _stopped(self.procs[r].pid)]
        if stopped:
            return stopped
        least = min(self._stage(r) for r in waiting)
        return [r for r in waiting if self._stage(r) == least]

    def error(self) -> str:
        """One line: the first fault (a late, stopped or dead rank), then the peers' errors."""
        reports = []
        for f in self.out.glob("rank*.err"):
            try:
                reports.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        reports.sort(key=lambda r: r["time"])
        # died without a report: a signal, or an exit code from outside our error path
        reported = {r["rank"] for r in reports}
        deaths = sorted(
            ((r, e) for r, e in self.exits.items() if e[2] != 0 and r not in reported),
            key=lambda x: x[1][1],
        )
        parts = []
        if self.late:
            ranks = ", ".join(map(str, self.late))
            where = _WHERE[min(self._stage(r) for r in self.late)]
            why = (
                "it is stopped: SIGSTOP, or a debugger"
                if self.stopped
                else "stopped? out of memory? an overloaded machine?"
            )
            parts.append(
                f"rank{'s' if len(self.late) > 1 else ''} {ranks} did not start within "
                f"{self.setup_s:g} s: still {where} ({why})"
            )
        elif self.stopped:
            ranks = ", ".join(map(str, self.stopped))
            parts.append(f"rank {ranks} is stopped (SIGSTOP, or a debugger)")
        # a death first, unless a report was certainly written before it (before the poll
        # that last saw the rank alive): a killed rank's peers fail within milliseconds
        if deaths and not (reports and reports[0]["time"] < deaths[0][1][0]):
            r, (_, by, code) = deaths[0]
            parts.append(f"rank {r} {_how(code)} at {by - self.wall0:.1f} s{self._when(r)}")
            deaths = deaths[1:]
        for rep in reports[:1]:
            parts.append(
                f"rank {rep['rank']} then failed: {rep['message']}" if parts else rep["message"]
            )
        for r, (_, by, code) in deaths:
            parts.append(f"rank {r} then {_how(code)} at {by - self.wall0:.1f} s")
        if not parts:
            codes = {r: e[2] for r, e in self.exits.items() if e[2] != 0}
            return f"rank(s) exited without a report (exit codes {codes})"
        return "; ".join(parts)

    def _when(self, rank: int) -> str:
        stage = self._stage(rank)
        return "" if stage == len(STAGES) else f", during start-up ({_WHERE[stage]})"


def _how(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code} without reporting an error"


def _stopped(pid: int) -> bool:
    """Linux: the process is stopped (SIGSTOP / SIGTSTP) or traced; elsewhere unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] in (["T"], ["t"])
