"""The simulator's outputs do not move under refactoring: every preset x strategy (x routing
and cost variants) gives the graph, trace and summary recorded in tests/golden/digests.json.

The default run checks every fourth case (all strategies and presets still appear); `pytest -m
slow tests/test_golden.py` checks all of them. After a change that is meant to move outputs,
re-record with `python -m tests.golden.outputs --write` and say why in the commit.
"""

from __future__ import annotations

import json

import pytest

from tests.golden import outputs

WANT = json.loads(outputs.DIGESTS.read_text())
CASES = outputs.configs()


def _params():
    for i, (name, cfg) in enumerate(CASES):
        marks = () if i % 4 == 0 else (pytest.mark.slow,)
        yield pytest.param(name, cfg, id=name, marks=marks)


def test_every_case_is_recorded():
    assert sorted(name for name, _ in CASES) == sorted(WANT)


@pytest.mark.parametrize("name,cfg", list(_params()))
def test_outputs_unchanged(name, cfg):
    assert outputs.digest(cfg) == WANT[name]
