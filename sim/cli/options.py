"""Options and checks the `moesim` subcommands share: size limits, refusing options that do
not apply (output paths are checked before the work by `sim.core.io`'s `check_output_dir`
and `check_output_file`)."""

from __future__ import annotations

import argparse

from sim.core.errors import ConfigError


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


def limit_opt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--limit",
        action="append",
        metavar="NAME=N",
        help="raise a size limit (repeatable): max_world, max_ranks, max_tasks, max_replicas, "
        "max_matrix, max_flows, max_skewed_flows, max_pairs (see `limits:` in a run config)",
    )
