"""The held-out table (benchmarks/heldout/megatron_bridge_later.csv, Megatron-Bridge releases
26.04-26.08) parses as `moesim predict` reads it, and every row has a recipes.yaml entry for
its own release (not the fallback to another release's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.training.predict import parse_row, read_table
from sim.training.recipe import _recipes

TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout" / "megatron_bridge_later.csv"
ROWS = read_table(TABLE)


def test_table_has_rows_of_later_releases_only() -> None:
    assert len(ROWS) >= 50
    assert {r["release"] for r in ROWS} == {"26.04", "26.04.01", "26.06", "26.06.01", "26.08"}
    assert all(r["source"].startswith("Megatron-Bridge ") for r in ROWS)


@pytest.mark.parametrize("n", range(1, len(ROWS) + 1))
def test_row_parses(n: int) -> None:
    run = parse_row(ROWS[n - 1], n)
    assert run.layout.gpus == int(ROWS[n - 1]["gpus"])


@pytest.mark.parametrize("n", range(1, len(ROWS) + 1))
def test_row_has_own_release_recipe(n: int) -> None:
    r = ROWS[n - 1]
    key = (r["model"], r["system"], r["precision"].strip().upper(), r["release"])
    recipe = _recipes().get(key)
    assert recipe is not None, f"row {n}: no recipes.yaml entry for {key}"
    assert "commit" in recipe.source
