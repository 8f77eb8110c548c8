"""Options and checks the `moesim` subcommands share: size limits, refusing options that do
not apply, output paths checked before the work."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sim.core.errors import ConfigError
from sim.core.io import check_output_dir, check_replaceable, name_output


def limits(a: argparse.Namespace) -> dict[str, int]:
    from sim.core.limits import parse

    return parse(a.limit)


def refuse(a: argparse.Namespace, options: dict[str, str], why: str) -> None:
    """A one-line error naming the given options that do not apply (attribute -> flag)."""
    given = [flag for attr, flag in options.items() if getattr(a, attr, None) not in (None, False)]
    if given:
        raise ConfigError(
            f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'} not apply {why}"
        )


def check_output_file(path: str, what: str) -> None:
    """An output file's path that cannot be written fails before the work, in one line: also
    one that holds a device, FIFO, socket, directory or link, which the write would replace
    (`sim.core.io.check_replaceable`). The option is remembered for the writer's errors."""
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


def limit_opt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--limit",
        action="append",
        metavar="NAME=N",
        help="raise a size limit (repeatable): max_world, max_ranks, max_tasks, max_replicas, "
        "max_matrix, max_flows, max_skewed_flows, max_pairs (see `limits:` in a run config)",
    )
