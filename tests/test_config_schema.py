"""The run config's schema: strict types, finite numbers in range, unknown keys with a "did
you mean", every error with its path, all errors of a file at once."""

from __future__ import annotations

import copy
import json

import pytest

from sim.config import RunConfig
from sim.config.run_schema import RunSpec
from sim.core.errors import ConfigError
from sim.core.schema import json_schema

BASE = {
    "topology": "dgx-a100",
    "nodes": 2,
    "model": {
        "batch": 2,
        "seq_len": 256,
        "model_dim": 512,
        "hidden_dim": 1024,
        "experts_per_gpu": 1,
        "top_k": 2,
        "capacity_factor": 1.2,
        "dtype": "bf16",
        "routing": {"kind": "zipf", "s": 1.2, "seed": 0},
    },
    "strategy": {"name": "pipelined", "degree": 2},
    "fabric": {"type": "fat_tree", "nodes_per_leaf": 1, "oversubscription": 2.0},
    "costs": {"roofline": {"flops_efficiency": 0.7}, "jitter": None},
    "output": {"dir": "out"},
    "passes": ["fwd", "bwd"],
}


def _set(path: str, value):
    raw = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return raw


def _error(raw) -> str:
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(raw, source="c.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("c.yaml: ")
    return msg


def test_the_base_config_is_valid():
    RunConfig.from_dict(BASE)


@pytest.mark.parametrize(
    "path,value,expected",
    [
        ("fabric.oversubscription", "abc", "fabric.oversubscription: expected a valid number"),
        ("fabric.oversubscription", 0.5, "fabric.oversubscription: must be >= 1"),
        ("costs.interference", "fast", "costs.interference: expected a mapping, got 'fast'"),
        ("output.dir", 0, "output.dir: expected a valid string, got 0"),
        ("model.dtype", ["bf16"], "model.dtype: expected 'fp32', 'tf32', 'fp16', 'bf16', 'fp8' or"),
        ("costs.roofline.flops_efficiency", 0, "flops_efficiency: must be > 0, got 0"),
        ("costs.roofline.flops_efficiency", 5, "flops_efficiency: must be <= 1, got 5"),
        ("model.capacity_factor", float("inf"), "model.capacity_factor: must be"),
        ("model.routing.s", float("nan"), "model.routing.s: must be a finite number"),
        ("nodes", True, "nodes: expected a valid integer, got True"),
        ("nodes", 2.5, "nodes: expected a valid integer, got 2.5"),
        ("model.routing.seed", 1.5, "model.routing.seed: expected a valid integer, got 1.5"),
        ("costs.alpha", -1e-6, "costs.alpha: must be >= 0"),
        ("costs.jitter", {"quantiles": {"gemm": [1, 1.1]}, "replicas": 0}, "replicas: must be > 0"),
        ("limits", {"max_ranks": 0}, "limits.max_ranks: must be > 0, got 0"),
        ("limits", {"max_rank": 5}, "limits.max_rank: unknown key (did you mean 'max_ranks'?)"),
        ("costs.dispatch", {"stream": float("inf")}, "costs.dispatch.stream: must be a finite"),
        ("model.routing", {"kind": "uniform", "s": 2}, "do not apply to routing kind"),
        ("model.routing", {"kind": "bogus"}, "model.routing.kind: expected 'uniform'"),
        ("passes", ["fwd", "back"], "passes.1: expected 'fwd' or 'bwd', got 'back'"),
        ("model.top_k", 0, "model.top_k: must be > 0, got 0"),
        ("parallel", {"ep": "8"}, "parallel.ep: expected a valid integer, got '8'"),
    ],
)
def test_bad_values_are_named_by_path(path, value, expected):
    assert expected in _error(_set(path, value))


@pytest.mark.parametrize(
    "path,expected",
    [
        (
            "fabric.oversubscripton",
            "fabric.oversubscripton: unknown key (did you mean 'oversubscription'?)",
        ),
        ("model.hiden_dim", "model.hiden_dim: unknown key (did you mean 'hidden_dim'?)"),
        ("costz", "costz: unknown key (did you mean 'costs'?)"),
        (
            "costs.roofline.flops",
            "costs.roofline.flops: unknown key (did you mean 'flops_efficiency'?)",
        ),
    ],
)
def test_misspelled_keys_get_a_did_you_mean(path, expected):
    assert expected in _error(_set(path, 2))


def test_every_error_of_a_file_at_once():
    raw = _set("nodes", 0)
    raw["model"]["batch"] = -1
    raw["output"]["trace_format"] = "xml"
    msg = _error(raw)
    for part in ("nodes: must be > 0", "model.batch: must be > 0", "output.trace_format"):
        assert part in msg


def test_strings_stand_for_their_kind_or_name():
    raw = _set("model.routing", "uniform")
    raw["strategy"], raw["passes"] = "sequential", "fwd"
    cfg = RunConfig.from_dict(raw)
    assert cfg.strategy == "sequential" and cfg.passes == ("fwd",)


def test_json_schema_for_editors():
    schema = json_schema(RunSpec, "moesim run config")
    json.dumps(schema)
    assert {"topology", "model", "costs", "parallel"} <= set(schema["properties"])


def test_run_spec_leaves_out_unused_sections_and_reads_the_same():
    """`run_spec` (start-up: only the validators a config needs are built) types the optional
    sections a config leaves out or empty as Any: that is exact only if an empty mapping is
    valid for each, and every problem of such a config reads as RunSpec's."""
    from sim.config import OPTIONAL_SECTIONS, run_spec
    from sim.core.schema import check

    bare = {k: v for k, v in BASE.items() if k not in OPTIONAL_SECTIONS}
    for section in OPTIONAL_SECTIONS:
        RunSpec.model_validate({**bare, section: {}})
    full = {**BASE, "parallel": {"ep": 16}, "limits": {"max_world": 64}}
    assert run_spec([]) is RunSpec and run_spec(full) is RunSpec
    assert run_spec(bare) is run_spec({**bare, "costs": {}})  # built once, then cached
    assert run_spec(bare) is not RunSpec
    bad = [
        {**bare, "nodes": 0, "costz": {}},
        {**bare, "model": {**bare["model"], "batch": True, "top_k": 0}, "passes": "fwdd"},
        {**bare, "strategy": None, "limits": {}, "output": {"dirr": "x"}},
        {**bare, "costs": None, "fabric": []},
    ]
    for raw in bad:
        with pytest.raises(ConfigError) as want:
            check(RunSpec, raw, "c.yaml")
        with pytest.raises(ConfigError) as got:
            check(run_spec(raw), raw, "c.yaml")
        assert str(got.value) == str(want.value)


def test_run_core_is_run_spec_with_its_sections_unchecked():
    """RunCore (what `run_spec` checks a config without optional sections by, so that a small
    run does not import their models) has RunSpec's fields in RunSpec's order, the same
    except the OPTIONAL_SECTIONS, which it types Any: a field added to RunSpec alone would
    be refused as unknown in such a config."""
    from typing import Any

    from sim.config import OPTIONAL_SECTIONS, run_spec
    from sim.config.run_core import RunCore

    assert list(RunCore.model_fields) == list(RunSpec.model_fields)
    for name, field in RunSpec.model_fields.items():
        core = RunCore.model_fields[name]
        assert core.description == field.description
        if name in OPTIONAL_SECTIONS:
            assert core.annotation is Any and core.default is None
        else:
            assert repr(core) == repr(field)
    assert run_spec({k: v for k, v in BASE.items() if k not in OPTIONAL_SECTIONS}) is RunCore
