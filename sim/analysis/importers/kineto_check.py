"""The one check of a Kineto trace file before any of it is used.

A profiler trace is an input like any other: it can be truncated, hand-edited, produced by
another tool or made up. The importer (sim.analysis.importers.kineto) reads event fields
directly, so every field it reads is checked here first, once, and every problem is one
`ConfigError` line naming the file, the event (index in traceEvents, and name) and what was
expected. Plausibility too: a negative duration, a timestamp that is not finite or lies far
from the others (it would shift the clock origin and quantise every other time), or a rank
that is not a non-negative integer would replay as something that was never measured.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

from sim.analysis.importers.kineto_names import parse_value
from sim.core import limits
from sim.core.errors import ConfigError
from sim.core.safeload import MAX_INPUT_BYTES, read_bytes

# the widest span of event timestamps in one trace: a profiled step lasts seconds, a long
# profile minutes; one event far outside this is a broken clock or a made-up value
MAX_SPAN_US = 86_400e6  # one day, in the trace's microseconds
_SCALAR = (int, str)  # pid, tid, correlation ids, devices and streams: keys, never lists


def inflate(path: Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The file's bytes, gunzipped if gzipped, never more than `limit` of them: a small gzip
    can inflate to gigabytes (a "zip bomb"), so the output is bounded while inflating."""
    raw = read_bytes(path, "trace")  # the file itself: the input limit of every file
    if raw[:2] != b"\x1f\x8b":
        return raw
    out = bytearray()
    data = raw
    try:
        while data:  # a gzip file may hold several members, one after another
            d = zlib.decompressobj(wbits=31)
            out += d.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise ConfigError(
                    f"trace {path}: inflates to over {limit} bytes (the input limit); "
                    "expected a profiler trace of a few steps"
                )
            if not d.eof:
                raise ConfigError(
                    f"trace {path}: truncated or corrupt gzip (ends mid-stream); expected a "
                    "gzipped JSON"
                )
            data = d.unused_data.lstrip(b"\x00")  # gzip allows zero padding after a member
    except zlib.error as e:
        raise ConfigError(
            f"trace {path}: truncated or corrupt gzip ({e}); expected a gzipped JSON"
        ) from None
    return bytes(out)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def events(path: Path, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's complete ('X') events, every field the importer reads checked."""
    info = doc.get("distributedInfo")
    if info is not None and not isinstance(info, dict):
        raise ConfigError(
            f"trace {path}: distributedInfo: expected an object, got {type(info).__name__}"
        )
    rank = (info or {}).get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise ConfigError(
            f"trace {path}: distributedInfo.rank {rank!r}: expected a non-negative integer"
        )
    # every complete event may become a task: bounded like any graph, before the work
    limits.active().check("max_tasks", len(doc["traceEvents"]), f"trace {path}: events")
    out = []
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict):
            raise ConfigError(
                f"trace {path}: traceEvents[{i}]: expected an event object, got {type(e).__name__}"
            )
        if e.get("ph") == "X":
            _check_event(path, i, e)
            out.append(e)
    if out:
        lo = min(e["ts"] for e in out)
        far = max(out, key=lambda e: e["ts"] + e.get("dur", 0))
        if far["ts"] + far.get("dur", 0) - lo > MAX_SPAN_US:
            first = min(out, key=lambda e: e["ts"])
            raise ConfigError(
                f"trace {path}: events span more than {MAX_SPAN_US / 86_400e6:g} day "
                f"(from {first['name']!r} at ts {lo:g} to {far['name']!r} at ts "
                f"{far['ts']:g} us); expected the timestamps of one profile"
            )
    return out


def _check_event(path: Path, i: int, e: dict[str, Any]) -> None:
    name = e.get("name")
    where = f"trace {path}: traceEvents[{i}]" + (f" ({name!r})" if isinstance(name, str) else "")

    def bad(field: str, expected: str) -> ConfigError:
        got = repr(e.get(field)) if field in e else "nothing"
        return ConfigError(f"{where}: {field}: expected {expected}, got {got[:60]}")

    if not isinstance(name, str):
        raise bad("name", "a string")
    if not _number(e.get("ts")):
        raise bad("ts", "a finite number (microseconds)")
    if "dur" in e and not (_number(e["dur"]) and e["dur"] >= 0):
        raise bad("dur", "a finite number >= 0 (microseconds)")
    for f in ("pid", "tid"):
        if f in e and not isinstance(e[f], _SCALAR):
            raise bad(f, "an integer or string")
    if "cat" in e and not isinstance(e["cat"], str):
        raise bad("cat", "a string")
    args = e.get("args")
    if args is None:
        return
    if not isinstance(args, dict):
        raise bad("args", "an object")
    _check_args(where, args)


def _check_args(where: str, args: dict[str, Any]) -> None:
    def fail(field: str, expected: str) -> ConfigError:
        return ConfigError(
            f"{where}: args[{field!r}]: expected {expected}, got {repr(args[field])[:60]}"
        )

    for f in ("Concrete Inputs", "Input type"):
        if f in args and not isinstance(args[f], list):
            raise fail(f, "a list")
    dims = args.get("Input Dims")  # per input: its dims, or a list of them (a tensor list)
    if dims is not None and not (isinstance(dims, list) and all(isinstance(d, list) for d in dims)):
        raise fail("Input Dims", "a list of lists")
    for f in ("correlation", "device", "stream"):
        if args.get(f) is not None and not isinstance(args[f], _SCALAR):
            raise fail(f, "an integer or string")
    if "bytes" in args and args["bytes"] is not None and not _number(args["bytes"]):
        raise fail("bytes", "a finite number")
    for f in ("In split size", "in_split_size"):  # NCCL all-to-all splits, parsed if text
        v = parse_value(args.get(f))
        if isinstance(v, list) and not all(_number(x) and x >= 0 for x in v):
            raise fail(f, "a list of non-negative numbers")
