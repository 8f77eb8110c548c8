"""Reading an output set back (a folder moesim wrote through sim.core.io.OutputSet).

A reader of such a folder (`moesim report` of a compare or sweep output, `moesim replay` of
an executor's) must not take a partial or mixed set for a result: a run killed while
swapping its files in, or a file edited or replaced since, would be read as what the run
produced. Where the folder has a manifest, it is checked (sim.core.io.verify_set) and any
problem refuses the read in one line. A folder without one is read as plain input (the
traces and reports in this repository, a folder assembled by hand), unless a staging
folder shows that a set was being written there when its writer died.
"""

from __future__ import annotations

from pathlib import Path

from sim.core.errors import ConfigError
from sim.core.io import MANIFEST, STAGE_PREFIX, settle_set, verify_set


def check_set(folder: str | Path, what: str, name: str | None = None) -> None:
    """ConfigError if `folder` holds a partial or changed output set. With `name` (a file
    read from it), only a set that lists that file counts: a results file dropped beside
    another run's manifest is not part of that set."""
    d = Path(folder)
    settle_set(d)  # a set committed by a writer killed mid-swap is whole: finish it first
    if not (d / MANIFEST).is_file():
        staged = sorted(p.name for p in d.glob(f"{STAGE_PREFIX}*") if p.is_dir())
        if staged:
            raise ConfigError(
                f"{what} {d}: a partial output set (no {MANIFEST}; {staged[0]} left by a run "
                "that did not finish); run it again"
            )
        return
    if name is not None and not _lists(d, name):
        return
    try:
        problems = verify_set(d)
    except (AttributeError, TypeError, OSError):  # a manifest of the wrong shape
        problems = [f"{d / MANIFEST}: unreadable manifest"]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(
            f"{what} {d}: not the output set its manifest lists: {problems[0]}{more}; "
            "run it again or restore the files"
        )


def _lists(d: Path, name: str) -> bool:
    import json

    try:
        files = json.loads((d / MANIFEST).read_text()).get("files")
    except (ValueError, OSError, AttributeError):
        return True  # unreadable: verify_set says so
    return not isinstance(files, dict) or name in files
