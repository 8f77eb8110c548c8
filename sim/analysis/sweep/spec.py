"""A sweep spec expanded into its points, each validated before anything runs.

A point is one run: the base config with one value of every swept key applied (through
`sim.analysis.whatif.keys.apply`, the same machinery as `moesim whatif --set`). Its `run_id`
is a hash of what the run depends on (the resolved config, link changes, compute speed), so
it is the same across restarts and machines; its labels name the config point without the
strategy (`config`) and the strategy (`strategy`), as the results rows carry them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sim.analysis.whatif.keys as keys
from sim.config import RunConfig
from sim.config.sweep_schema import SweepSpec
from sim.core.errors import ConfigError, MoesimError
from sim.core.schema import check

MAX_POINTS = 100_000  # a typo (a 1,000-value list crossed with others) is refused, not queued
STRATEGY_KEYS = ("strategy",)  # and strategy.<param>: part of the strategy label


@dataclass(frozen=True)
class Point:
    index: int  # position in the expansion (the order of the consolidated results)
    run_id: str
    config: str  # label of the config point without the strategy
    strategy: str  # label of the strategy, `name:k=v,...`
    params: dict[str, Any]  # swept key -> value, as the spec gives it
    raw: dict[str, Any]  # the resolved run config (validated)
    source: str  # how errors of this run name it
    links: tuple[keys.Change, ...] = ()  # link classes changed on the loaded topology
    speed: float = 1.0  # compute speed factor


@dataclass(frozen=True)
class Sweep:
    source: str
    keys: list[str]  # swept keys, in the spec's order (grid, then zip groups)
    points: list[Point]
    fingerprint: str  # of the whole spec, base config included: a different spec, a new one
    name: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)  # normalised: the base as a mapping


def load(spec: Any) -> Sweep:
    """A Sweep from a spec file path, a mapping or a Sweep; a ConfigError (one line naming
    the spec and the place in it) for anything wrong, before any run."""
    if isinstance(spec, Sweep):
        return spec
    if isinstance(spec, dict):
        raw, source, here = spec, "sweep spec <dict>", Path.cwd()
    else:
        from sim.core.safeload import load_yaml

        raw, source, here = load_yaml(spec, "sweep spec"), f"sweep spec {spec}", Path(spec).parent
    if raw is None:
        raw = {}
    s: SweepSpec = check(SweepSpec, raw, source)
    base = _base(s.base, here, source)
    if s.passes:
        base = RunConfig.from_dict({**base.to_dict(), "passes": list(s.passes)}, base.source)
    axes = _axes(s, source)
    total = 1
    for ax in axes:
        total *= len(ax[1][0])
    if total > MAX_POINTS:
        raise ConfigError(f"{source}: {total:,} points is over the {MAX_POINTS:,} a sweep runs")
    points = [_located(i, base, combo, source) for i, combo in enumerate(_combos(axes))]
    _check_unique(points, source)
    _check_clusters(points)
    normal = {
        "base": _plain(base.to_dict()),
        "axes": [[list(ks), _plain(vals)] for ks, vals in axes],
    }
    return Sweep(
        source,
        [k for ks, _ in axes for k in ks],
        points,
        _hash(normal),
        s.name,
        normal,
    )


def _base(base: str | dict[str, Any] | None, here: Path, source: str) -> RunConfig:
    if base is None:
        return RunConfig.demo()
    if isinstance(base, dict):
        return RunConfig.from_dict(base, source=f"{source}: base")
    try:
        return RunConfig.load(here / base)
    except ConfigError as e:
        raise ConfigError(f"{source}: base: {e}") from None


Axis = tuple[list[str], list[list[Any]]]  # keys varied together, and one value list per key


def _axes(s: SweepSpec, source: str) -> list[Axis]:
    axes: list[Axis] = []
    seen: dict[str, str] = {}
    groups = [("grid", {k: v}) for k, v in s.grid.items()]
    groups += [(f"zip[{i}]", g) for i, g in enumerate(s.zip_)]
    for where, group in groups:
        if not group:
            raise ConfigError(f"{source}: {where}: an empty group (give keys with lists)")
        for key in group:
            loc = f"{where}.{key}" if where == "grid" else f"{where}: {key}"
            try:
                keys.check_key(key, where=f"{source}: {where}:")
            except ConfigError:
                raise ConfigError(f"{source}: {loc}: unknown key (known: {keys.known()})") from None
            if key in seen:
                raise ConfigError(f"{source}: {loc}: {key!r} is also varied in {seen[key]}")
            seen[key] = where
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            given = ", ".join(f"{k}: {n}" for k, n in lengths.items())
            raise ConfigError(
                f"{source}: {where}: the lists of a zip group need one length, got {given}"
            )
        axes.append((list(group), [list(v) for v in group.values()]))
    return axes


def _combos(axes: list[Axis]) -> Any:
    """Every combination as [(key, value)], the last axis varying fastest."""
    ranges = [range(len(vals[0])) for _, vals in axes]
    for idx in itertools.product(*ranges):
        yield [(k, v[i]) for (ks, vals), i in zip(axes, idx) for k, v in zip(ks, vals)]


def _located(index: int, base: RunConfig, combo: list[tuple[str, Any]], source: str) -> Point:
    """`_point`, its errors naming the spec and the point (a strategy entry's own error
    does not)."""
    try:
        return _point(index, base, combo, source)
    except MoesimError as e:
        raise ConfigError(_at(str(e), f"{source}: point {_label(combo)}")) from None


def _at(message: str, where: str) -> str:
    return message if message.startswith(where.split(": point")[0]) else f"{where}: {message}"


def _label(combo: list[tuple[str, Any]]) -> str:
    return ",".join(f"{k}={text(v)}" for k, v in combo) or "base"


def _point(index: int, base: RunConfig, combo: list[tuple[str, Any]], source: str) -> Point:
    params = dict(combo)
    label = _label(combo)
    where = f"{source}: point {label}:"
    changes = [keys.change(k, v, text(v), where=where) for k, v in params.items()]
    applied = keys.apply(base, changes, [])
    cfg = RunConfig.from_dict(applied.raw, source=f"{source}: point {label}")
    raw = cfg.to_dict()
    raw.pop("output", None)  # where a run would write its files: no part of a sweep's run
    strategy = cfg.strategy + (
        ":" + ",".join(f"{k}={text(v)}" for k, v in sorted(cfg.strategy_params.items()))
        if cfg.strategy_params
        else ""
    )
    config = (
        ",".join(f"{k}={text(v)}" for k, v in params.items() if not _is_strategy_key(k)) or "base"
    )
    run_id = _hash(
        {
            "config": _plain(raw),
            "links": [[c.key, c.text] for c in applied.links],
            "speed": applied.speed,
        }
    )
    return Point(
        index,
        run_id,
        config,
        strategy,
        params,
        raw,
        cfg.source,
        tuple(applied.links),
        applied.speed,
    )


def _is_strategy_key(key: str) -> bool:
    return key in STRATEGY_KEYS or key.startswith("strategy.")


def _check_unique(points: list[Point], source: str) -> None:
    first: dict[str, Point] = {}
    for p in points:
        q = first.setdefault(p.run_id, p)
        if q is not p:
            raise ConfigError(
                f"{source}: points {q.config} / {q.strategy} and {p.config} / {p.strategy} "
                "are the same run (a value given twice?)"
            )


def _check_clusters(points: list[Point]) -> None:
    """Every distinct cluster and cost model builds (a topology name, a node count, fabric
    options, link classes that exist, costs the network model can use) before the first
    run: a typo fails the sweep, not each of its rows."""
    from sim.analysis.whatif.study import with_links
    from sim.core.limits import applied
    from sim.hardware.costs import CostModel

    seen: set[str] = set()
    for p in points:
        r = p.raw
        what = _hash(
            [r["topology"], r.get("nodes"), r.get("fabric"), r.get("limits"), r.get("costs")]
            + [c.key for c in p.links]
        )
        if what in seen:
            continue
        seen.add(what)
        cfg = RunConfig.from_dict(r, source=p.source)
        try:
            with applied(cfg.size_limits()):
                CostModel.build(with_links(cfg.load_topology(), list(p.links)), cfg.costs)
        except MoesimError as e:
            raise ConfigError(_at(str(e), p.source)) from None


def text(value: Any) -> str:
    """A value as labels show it: numbers and strings as written, anything else as compact
    JSON with sorted keys (stable across runs)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))


def _plain(value: Any) -> Any:
    """JSON-ready: tuples as lists, keys as strings."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _hash(obj: Any) -> str:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:16]
