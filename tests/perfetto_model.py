"""How Perfetto's JSON importer reads a Chrome trace, modelled closely enough to count what it
would drop: the tests and benchmarks/chrome_trace.py check moesim's traces with it (Perfetto's
own trace processor downloads a binary at run time, which this environment cannot).

What is modelled (from reading Perfetto's trace processor, json importer and slice tracker):
- a time value in microseconds becomes integer nanoseconds: an integer token times 1000, a
  fractional token rounded (`llround(value * 1000.0)`, the current importer), or, for a string
  token, the decimal point shifted three places and the rest cut off. `ts_variants` returns
  every reading, so a test can insist they agree. The older jsoncpp-based importer read `ts`
  from its text and truncated `dur` (`load(..., truncating=True)`);
- complete slices (`ph: X`) on one thread (pid, tid) are sorted by ts, longer first at equal
  ts, and nested on a stack: a slice starting at or after the top's end pops it; a slice that
  starts inside the top but ends after it is not nested and is dropped (Perfetto counts it in
  its stats and the UI never shows it);
- flow events (`ph: s` / `f`, matched by `id` and `cat`) bind to the enclosing slice of their
  thread at their ts (`bp: "e"` on the finish: the slice enclosing it, not the next one).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from decimal import Decimal
from typing import Any

_NUMBER = re.compile(r'"(ts|dur)":\s*(-?[0-9.eE+-]+)')


def ns_from_number(token: str) -> int:
    """A JSON number token (microseconds) as Perfetto's current importer reads it."""
    if re.fullmatch(r"-?[0-9]+", token):
        return int(token) * 1000
    return int(_llround(float(token) * 1000.0))


def ns_from_number_truncating(token: str) -> int:
    """The same token as older Perfetto (jsoncpp) read a fraction: `(int64)(value * 1000.0)`,
    which can be 1 ns short (its tokenizer took `ts` from the text, only `dur` this way)."""
    if re.fullmatch(r"-?[0-9]+", token):
        return int(token) * 1000
    return int(float(token) * 1000.0)


def ns_from_text(token: str) -> int:
    """The same token read as text, decimal point shifted (Perfetto's string path)."""
    d = Decimal(token) * 1000
    return int(d.to_integral_value(rounding="ROUND_DOWN"))


def _llround(x: float) -> int:
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def ts_variants(text: str) -> list[tuple[int, int]]:
    """Every ts/dur token of a trace file as (number reading, text reading) in ns."""
    return [(ns_from_number(m.group(2)), ns_from_text(m.group(2))) for m in _NUMBER.finditer(text)]


class _Token(float):
    """A JSON fraction that remembers its text."""

    text: str

    @classmethod
    def parse(cls, text: str) -> _Token:
        v = cls(text)
        v.text = text
        return v


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON (Perfetto's parser rejects the file)")


def load(text: str, truncating: bool = False) -> list[dict[str, Any]]:
    """The events, each ts/dur also as Perfetto's integer nanoseconds (`ts_ns`, `dur_ns`),
    read from its own token (not through a reformatted Python float); `truncating`: as the
    older importer did (ts from the text, dur truncated)."""
    doc = json.loads(text, parse_float=_Token.parse, parse_constant=_not_json)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for e in events:
        for key in ("ts", "dur"):
            v = e.get(key)
            if isinstance(v, _Token) and truncating:
                read = ns_from_text if key == "ts" else ns_from_number_truncating
                e[key + "_ns"] = read(v.text)
            elif isinstance(v, _Token):
                e[key + "_ns"] = ns_from_number(v.text)
            elif isinstance(v, int):
                e[key + "_ns"] = v * 1000
    return events


def nest(events: list[dict[str, Any]]) -> tuple[int, dict[tuple[Any, Any], list[tuple]]]:
    """(slices dropped, per thread the kept slices as (ts, end, depth, event index))."""
    per: dict[tuple[Any, Any], list[tuple[int, int, int]]] = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") == "X":
            per[(e["pid"], e["tid"])].append((e["ts_ns"], e["dur_ns"], i))
    dropped = 0
    kept: dict[tuple[Any, Any], list[tuple]] = {}
    for key, slices in per.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []  # ends of the open slices
        out = []
        for ts, dur, i in slices:
            end = ts + dur
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and end > stack[-1]:
                dropped += 1  # overlaps its parent without nesting in it
                continue
            out.append((ts, end, len(stack), i))
            stack.append(end)
        kept[key] = out
    return dropped, kept


def dropped_slices(text: str, truncating: bool = False) -> int:
    """How many complete slices Perfetto would drop from this trace file."""
    return nest(load(text, truncating))[0]
