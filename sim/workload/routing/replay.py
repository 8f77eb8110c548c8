"""Router maps: recorded routing, replayed through any strategy.

A router map is a NumPy `.npz` file (no pickles) holding one of
- `counts`: int [steps, layers, P, E], the choices source rank p's gate made for expert e
  (before any capacity: what a dropless layer computes), or
- `choices`: int [steps, layers, P, T, k], the expert ids each token of rank p picked;
  turned into counts on load (each token's k ids must be distinct experts),
and optionally `experts` (a scalar: E, when the highest experts were never chosen) and
`top_k`, `tokens` (scalars, checked against the model). `{kind: replay, file, step, layer}`
takes one (step, layer) map. `write` makes such a file (the executor's `--record-routing`
uses it; any torch MoE layer can call it with the top-k indices it computed).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from sim.core.errors import ConfigError

FIELDS = {"kind", "file", "step", "layer"}
WHAT = "model.routing.file"
MAX_UNPACKED = 2**29  # bytes the arrays of one file may unpack to (a compressed bomb stops)


def write(path: str | Path, counts: np.ndarray | None = None, **scalars: int) -> None:
    """Write a router map of `counts` [steps, layers, P, E] (module doc), atomically."""
    from sim.core.io import atomic_write_bytes

    c = np.asarray(counts)
    if c.ndim != 4 or not np.issubdtype(c.dtype, np.integer) or (c < 0).any():
        raise ValueError("counts: expected non-negative integers [steps, layers, P, E]")
    buf = io.BytesIO()
    arrays: dict[str, np.ndarray] = {"counts": c.astype(np.int64)}
    arrays |= {k: np.asarray(v, dtype=np.int64) for k, v in scalars.items()}
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub: allow_pickle
    atomic_write_bytes(Path(path), buf.getvalue())


def counts_from_choices(choices: np.ndarray, experts: int) -> np.ndarray:
    """[..., T, k] expert ids -> [..., E] counts."""
    ch = np.asarray(choices)
    lead = ch.shape[:-2]
    flat = ch.reshape(-1, ch.shape[-2] * ch.shape[-1])
    out = np.stack([np.bincount(r, minlength=experts) for r in flat]) if flat.size else None
    if out is None:
        return np.zeros((*lead, experts), dtype=np.int64)
    return out.reshape(*lead, experts).astype(np.int64)


def load(path: str | Path) -> dict[str, Any]:
    """The file's arrays, checked: {'counts': [S, L, P, E], 'top_k', 'tokens' or None}."""
    from sim.core.safeload import read_bytes

    path = Path(str(path))
    data = read_bytes(path, WHAT)
    try:
        unpacked = sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(data)).infolist())
        if unpacked > MAX_UNPACKED:
            raise ConfigError(
                f"{WHAT} {path}: its arrays unpack to {unpacked:,} bytes, over the "
                f"{MAX_UNPACKED:,} a router map may hold"
            )
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{WHAT} {path}: not a router map .npz ({first})") from None
    known = {"counts", "choices", "experts", "top_k", "tokens"}
    unknown = sorted(set(arrays) - known)
    if unknown:
        raise ConfigError(f"{WHAT} {path}: unknown array(s) {unknown} (known: {sorted(known)})")
    if ("counts" in arrays) == ("choices" in arrays):
        raise ConfigError(f"{WHAT} {path}: expected exactly one of 'counts' or 'choices'")
    scalars: dict[str, int | None] = {}
    for k in ("experts", "top_k", "tokens"):
        v = arrays.get(k)
        if v is not None and (v.ndim != 0 or not np.issubdtype(v.dtype, np.integer) or v < 1):
            raise ConfigError(f"{WHAT} {path}: '{k}' must be a positive integer scalar")
        scalars[k] = None if v is None else int(v)
    name = "counts" if "counts" in arrays else "choices"
    a = arrays[name]
    want = 4 if name == "counts" else 5
    dims = "[steps, layers, P, E]" if name == "counts" else "[steps, layers, P, T, k]"
    if a.ndim != want or not np.issubdtype(a.dtype, np.integer):
        raise ConfigError(
            f"{WHAT} {path}: '{name}' must be an integer array {dims}, got {a.dtype} of "
            f"shape {list(a.shape)}"
        )
    if (a < 0).any():
        raise ConfigError(f"{WHAT} {path}: '{name}' has negative entries")
    if name == "choices":
        experts = scalars["experts"] or int(a.max(initial=-1)) + 1
        if a.size and int(a.max()) >= experts:
            raise ConfigError(f"{WHAT} {path}: expert ids reach {int(a.max())}, not < {experts}")
        srt = np.sort(a, axis=-1)
        if a.shape[-1] > 1 and (srt[..., 1:] == srt[..., :-1]).any():
            raise ConfigError(f"{WHAT} {path}: a token picks one expert twice in 'choices'")
        counts = counts_from_choices(a, experts)
        scalars["top_k"] = scalars["top_k"] or a.shape[-1]
        scalars["tokens"] = scalars["tokens"] or a.shape[-2]
    else:
        counts = a.astype(np.int64)
        if scalars["experts"] is not None and counts.shape[-1] != scalars["experts"]:
            raise ConfigError(
                f"{WHAT} {path}: 'counts' has {counts.shape[-1]} experts, 'experts' says "
                f"{scalars['experts']}"
            )
    return {"counts": counts, "top_k": scalars["top_k"], "tokens": scalars["tokens"]}


def routed(routing: dict[str, Any], world: int, experts: int, tokens: int, top_k: int):
    """[P, E] of one recorded (step, layer), checked against the layer."""
    unknown = set(routing) - FIELDS - {"counts"}
    if unknown:
        raise ConfigError(f"model.routing: unknown field(s) {sorted(unknown)} for replay")
    if "file" not in routing and "counts" not in routing:
        raise ConfigError("model.routing.file: a replay needs the router map's file")
    rec = routing["counts"] if "counts" in routing else load(routing["file"])
    counts = rec["counts"]
    where = f"{WHAT} {routing.get('file', '')}".rstrip()
    picks = {}
    for name, n in (("step", counts.shape[0]), ("layer", counts.shape[1])):
        v = routing.get(name, 0)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
            raise ConfigError(
                f"model.routing.{name}: expected 0..{n - 1} (the map has {n}), got {v!r}"
            )
        picks[name] = v
    m = counts[picks["step"], picks["layer"]]
    if m.shape != (world, experts):
        raise ConfigError(
            f"{where}: the map is {m.shape[0]} ranks x {m.shape[1]} experts, the layer "
            f"{world} x {experts}"
        )
    for name, want in (("top_k", top_k), ("tokens", tokens)):
        if rec.get(name) is not None and rec[name] != want:
            raise ConfigError(f"{where}: recorded with {name} {rec[name]}, the layer has {want}")
    sums = m.sum(axis=1)
    if (sums != top_k * tokens).any():
        p = int(np.flatnonzero(sums != top_k * tokens)[0])
        raise ConfigError(
            f"{where}: rank {p} made {int(sums[p])} choices at step {picks['step']} layer "
            f"{picks['layer']}, the layer's top_k x tokens is {top_k * tokens}"
        )
    if (m > tokens).any():
        raise ConfigError(f"{where}: an expert gets more than a rank's {tokens} tokens from it")
    return m.astype(np.int64)
