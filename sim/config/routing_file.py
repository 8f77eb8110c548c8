"""Files a run config names besides itself: a routing matrix (`model.routing: {kind: matrix,
file: ...}`) and a calibration (`costs.calibration`), read like every input (`sim.core.safeload`:
a regular file within the size limit, UTF-8, bounded YAML). The matrix must be a 2-D array of
finite, non-negative token counts (CSV, .npy without pickles, or JSON, as `sim.workload.moe`
reads them).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from sim.core.errors import ConfigError
from sim.core.safeload import load_json, load_yaml, read_bytes, read_text

MAX_ENTRY = 2.0**53  # tokens; exact as a float, safe to cast to int64


def load_matrix_file(file: str) -> np.ndarray:
    """The matrix in `file`, or a ConfigError naming the file and what is wrong."""
    path = Path(str(file))
    what = "model.routing.file"
    try:
        if path.suffix == ".npy":
            data = np.load(io.BytesIO(read_bytes(path, what)), allow_pickle=False)
        elif path.suffix == ".json":
            data = load_json(path, what)
        else:
            data = np.loadtxt(io.StringIO(read_text(path, what)), delimiter=",", ndmin=2)
        m = np.asarray(data, dtype=float)
    except (ValueError, TypeError, json.JSONDecodeError, EOFError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{what} {path}: not a numeric matrix ({first})") from None
    if m.ndim != 2:
        raise ConfigError(f"{what} {path}: expected a 2-D matrix, got {m.ndim} dimension(s)")
    if not np.isfinite(m).all() or (m < 0).any() or (m > MAX_ENTRY).any():
        raise ConfigError(f"{what} {path}: entries must be finite token counts in [0, 2^53]")
    return m


def check_calibration_file(file: str) -> None:
    """A calibration file that is a FIFO, binary, an alias bomb or nested too deeply fails
    here in one line; its fields are the calibration reader's (sim.hardware.costs)."""
    load_yaml(Path(str(file)), "calibration file")
