"""Result tables `moesim report` reads, normalised to one row schema.

The shared results row schema (one row per (config point, strategy) run), written by
`moesim sweep` and `moesim compare --out`:

    run_id            str    stable hash of the run's parameters
    config            str    readable stable label of the config point, strategy aside
    strategy          str    e.g. "pipelined:degree=4"
    status            str    "ok" | "error"
    error             str    "" when ok
    makespan_s        float  simulated time of one step
    time_per_token_s  float  makespan / distinct tokens per step (the ranking metric)
    tokens            int    distinct tokens per step
    gpus              int
    measured_s        float  optional: a measured makespan
    param.<key>       any    the parameters that define the point

Inputs: a sweep's Parquet/CSV (or its output directory), a `compare --out` directory (its
`results.csv`), and a `validate` output (`validation.json`: simulated and measured makespans
per graph). A file that is missing, truncated or of another kind is one error line.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict

from sim.core.errors import ConfigError
from sim.core.safeload import load_json, read_bytes
from sim.core.schema import Strict, check

REQUIRED = (
    "run_id",
    "config",
    "strategy",
    "status",
    "error",
    "makespan_s",
    "time_per_token_s",
    "tokens",
    "gpus",
)
NUMERIC = ("makespan_s", "time_per_token_s", "tokens", "gpus", "measured_s")
# looked for in a directory, in this order: sweep, compare --out, validate
DIR_FILES = ("results.parquet", "results.csv", "validation.json")


def load_results(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Every file's rows in the shared schema, plus `source` (the path they came from)."""
    if not paths:
        raise ConfigError("results: name at least one results file or directory")
    frames = [_load_one(Path(p)) for p in paths]
    return pd.concat(frames, ignore_index=True)


def _load_one(path: Path) -> pd.DataFrame:
    from sim.analysis.output_sets import check_set

    if path.is_dir():
        check_set(path, "results")  # a partial or mixed set must not read as a result
        found = next((path / n for n in DIR_FILES if (path / n).is_file()), None)
        if found is None:
            raise ConfigError(
                f"results {path}: no {', '.join(DIR_FILES)} there (expected the output "
                "directory of moesim sweep, compare --out or validate)"
            )
        path = found
    else:  # a file of an output set: the set's manifest says whether it is whole
        check_set(path.parent, "results", path.name)
    suffix = path.suffix.lower()
    if suffix == ".json":
        df = _from_validation(path)
    elif suffix in (".parquet", ".csv"):
        df = _read_table(path, suffix)
    else:
        raise ConfigError(
            f"results {path}: expected a .parquet or .csv results table, a validation.json "
            "or their directory"
        )
    df = _checked(df, path)
    df["source"] = str(path)
    return df


def _read_table(path: Path, suffix: str) -> pd.DataFrame:
    data = read_bytes(path, "results file")
    if suffix == ".csv":
        _strict_csv(path, data)
    try:
        if suffix == ".parquet":
            return pd.read_parquet(io.BytesIO(data))
        return pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=[""])
    except Exception as e:  # pyarrow's and pandas' parser errors: a damaged or foreign file
        kind = "Parquet" if suffix == ".parquet" else "CSV"
        why = " ".join(str(e).split())[:160]
        raise ConfigError(f"results {path}: not a readable {kind} table ({why})") from None


def _strict_csv(path: Path, data: bytes) -> None:
    """A CSV cut short still parses (pandas fills the missing fields of the last row with
    NaN, and a row cut at a field boundary looks complete): every row must end with a line
    break and have as many fields as the header, else one line naming the file and line."""
    import csv

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"results {path}: not UTF-8 text (offset {e.start})") from None
    if text and not text.endswith("\n"):
        line = text.count("\n") + 1
        raise ConfigError(
            f"results {path}: line {line} is incomplete (no line break at the end: a file "
            "cut short?); expected a whole moesim results CSV"
        )
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, [])
    for row in reader:
        if row and len(row) != len(header):
            raise ConfigError(
                f"results {path}: line {reader.line_num} has {len(row)} field(s), the header "
                f"{len(header)} (a file cut short or hand-edited?)"
            )


def _checked(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The required columns, typed; ok rows complete (a truncated file leaves holes)."""
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError(
            f"results {path}: not a moesim results table (missing column(s) {', '.join(missing)})"
        )
    if df.empty:
        raise ConfigError(f"results {path}: no rows")
    df = df.copy()
    for c in ("run_id", "config", "strategy", "status", "error"):
        df[c] = ["" if v is None or v != v else str(v) for v in df[c]]  # NaN: empty
    bad = sorted(set(df["status"]) - {"ok", "error"})
    if bad:
        raise ConfigError(
            f"results {path}: column status: expected 'ok' or 'error', got {bad[0]!r}"
        )
    for c in NUMERIC:
        if c in df.columns:
            try:
                df[c] = pd.to_numeric(df[c], errors="raise").astype(float)
            except (ValueError, TypeError):
                raise ConfigError(f"results {path}: column {c}: expected numbers") from None
    ok = df["status"] == "ok"
    need = df.loc[ok, ["makespan_s", "time_per_token_s", "tokens", "gpus"]]
    holes = need.isna().any(axis=1) | (need <= 0).any(axis=1) | ~need.map(_finite).all(axis=1)
    if holes.any():
        row = int(holes.idxmax())
        raise ConfigError(
            f"results {path}: row {row + 1} ({df.at[row, 'config']} / "
            f"{df.at[row, 'strategy']}): status ok without positive finite makespan_s, "
            "time_per_token_s, tokens and gpus (a truncated or hand-edited file?)"
        )
    if (df.loc[ok, "config"] == "").any() or (df["strategy"] == "").any():
        raise ConfigError(f"results {path}: rows without a config or strategy label")
    return df


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# -- validate's output ---------------------------------------------------------------------


class _Graph(Strict):
    graph: str
    measured_s: float
    simulated_s: float
    error_pct: float | None = None  # NaN where nothing was measured (not read here)
    tasks_matched: int
    per_kind: dict[str, Any]
    measured_runs_s: list[float] | None = None


class _Validation(BaseModel):  # the fields read; the summary and file list are not needed
    model_config = ConfigDict(extra="ignore", strict=True)
    results: list[_Graph]
    context: dict[str, str]


def _from_validation(path: Path) -> pd.DataFrame:
    raw = load_json(path, "results file")
    if not isinstance(raw, dict) or "results" not in raw:
        raise ConfigError(f"results {path}: not a moesim validate output (no 'results' list)")
    v = check(_Validation, raw, f"results {path}")
    layer = v.context.get("layer", "")
    m = re.search(r"\bB=(\d+) L=(\d+)", layer)
    ranks = re.match(r"\s*(\d+)", v.context.get("ranks", ""))
    if not (m and ranks):
        raise ConfigError(f"results {path}: context.layer / context.ranks: expected 'B=.. L=..'")
    gpus = int(ranks.group(1))
    tokens = int(m.group(1)) * int(m.group(2)) * gpus
    if tokens < 1:  # the time per token divides by them
        raise ConfigError(
            f"results {path}: context ranks {v.context['ranks']!r}, layer {layer!r}: expected "
            "ranks, B and L of at least 1"
        )
    rows = []
    for g in v.results:
        strategy, _, passes = g.graph.rpartition(" ")  # "pipelined r=2 fwd+bwd"
        config = f"validate: {layer}, {v.context.get('ranks', '')}, passes {passes}"
        rows.append(
            {
                "run_id": hashlib.sha256(f"{config}|{strategy}".encode()).hexdigest()[:16],
                "config": config,
                "strategy": strategy or g.graph,
                "status": "ok",
                "error": "",
                "makespan_s": g.simulated_s,
                "time_per_token_s": g.simulated_s / tokens,
                "tokens": tokens,
                "gpus": gpus,
                "measured_s": g.measured_s,
                "graph": g.graph,  # names the traces/ files beside it
            }
        )
    return pd.DataFrame(rows)


def parse_threshold(text: str) -> float:
    """'5%' or 0.05 -> 0.05; anything else a one-line error."""
    t = str(text).strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0 or (value >= 1 and not t.endswith("%")):
        raise ConfigError(
            f"--threshold {text!r}: expected a percentage like 5% or a fraction like 0.05"
        )
    return value
