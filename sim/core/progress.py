"""Progress bars on stderr for long work, and hints printed once.

Bars are shown only where someone is watching: when stderr is a terminal. The environment
variable MOESIM_PROGRESS overrides that (`0` never, `1` always, e.g. in a CI log); the CLI
turns bars off under `--json` (`set_enabled(False)`), so a machine reading the output gets
nothing but the output. A bar appears only once its work has run for DELAY_S seconds, so
short work prints nothing at all. tqdm is imported only when a bar is created.

    with Bar(total=len(items), desc="compare", unit="run") as bar:
        for item in items:
            work(item)
            bar.update()
    for item in iterate(items, "compare", "run"): ...   # the same
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "MOESIM_PROGRESS"
DELAY_S = 1.0  # work shorter than this shows no bar
REFRESH_S = 0.5  # at most this often a bar is redrawn

_enabled: bool | None = None  # set_enabled(); None: from ENV and the terminal
_hinted: set[str] = set()  # hints already printed in this process


def set_enabled(on: bool | None) -> None:
    """Bars on (True), off (False), or decided by MOESIM_PROGRESS and the terminal (None)."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    """Whether bars are shown now (see the module docstring for the rule)."""
    if _enabled is not None:
        return _enabled
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("0", "off", "no", "false"):
        return False
    if env in ("1", "on", "yes", "true"):
        return True
    err = sys.stderr
    return err is not None and hasattr(err, "isatty") and err.isatty()


class Bar:
    """One progress bar on stderr, or nothing at all while progress is off (every method is
    then a no-op, so callers need no test of their own)."""

    __slots__ = ("_bar",)

    def __init__(
        self, total: float | None, desc: str, unit: str = "it", delay: float | None = None
    ):
        self._bar: Any = None
        if enabled():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                delay=DELAY_S if delay is None else delay,
                mininterval=REFRESH_S,
                # the average rate since the start, not a moving average: tasks finish in
                # bursts (a whole collective at once), and a moving average swung the
                # ETA 30x (00:24 -> 10:57 -> 00:19) between bursts
                smoothing=0.0,
                file=sys.stderr,
                leave=False,  # a finished bar is wiped: the command's own output stays clean
                dynamic_ncols=True,
            )

    @property
    def shown(self) -> bool:
        """Whether this bar exists (progress is on), whether or not it is drawn yet."""
        return self._bar is not None

    def update(self, n: float = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set_total(self, total: float | None) -> None:
        """The total, once known (a bar started without one)."""
        if self._bar is not None and self._bar.total != total:
            self._bar.total = total

    def set(self, done: float) -> None:
        """Move the bar to `done` (absolute)."""
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def note(self, text: str) -> None:
        """Text after the bar, e.g. the simulated time reached; drawn with the next update."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def refresh(self) -> None:
        """Redraw now (elapsed time and rate move even when no unit has finished)."""
        if self._bar is not None:
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iterate(items: Iterable[T], desc: str, unit: str = "it") -> Iterator[T]:
    """`items`, one bar step per item (the total is known where `items` has a length)."""
    total = len(items) if isinstance(items, Sized) else None
    with Bar(total, desc, unit) as bar:
        for item in items:
            yield item
            bar.update()


def echo(text: str) -> None:
    """A line of the command's output on stdout that does not tear a bar drawn on stderr."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stdout)
    else:
        print(text)


def hint(key: str, text: str) -> None:
    """`moesim: hint: <text>` on stderr, once per process for each `key` (shown with bars on
    or off: it is one line, and it says how to make the work faster)."""
    if key in _hinted:
        return
    _hinted.add(key)
    line = f"moesim: hint: {text}"
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)
