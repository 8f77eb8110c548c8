"""`--cost` takes the nested keys `whatif --set` takes (issue 21, item 9): a dotted key sets
one field of a nested `costs:` mapping and keeps the config's other fields there."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml

from sim.cli import main
from sim.config import _merged
from sim.core.errors import ConfigError
from tests.configs import SMALL


def test_dotted_keys_merge_into_nested_mappings():
    base = {"resources": {"sm_share": 0.5, "max_connections": 8}, "network": "flow"}
    got = _merged(base, {"resources.max_connections": 1, "alpha_beta.gemm.alpha": 1e-5})
    assert got == {
        "resources": {"sm_share": 0.5, "max_connections": 1},
        "network": "flow",
        "alpha_beta": {"gemm": {"alpha": 1e-5}},
    }
    assert base["resources"]["max_connections"] == 8  # the config itself is not changed


def _simulate(tmp_path, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**SMALL, "costs": {"resources": {"sm_share": 0.6}}}))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["simulate", str(path), "--json", *extra])
    return rc, out.getvalue(), err.getvalue()


def test_cost_accepts_nested_keys(tmp_path):
    rc, out, err = _simulate(tmp_path, "--cost", "resources.max_connections=2")
    assert rc == 0, err
    assert json.loads(out)["makespan_s"] > 0


@pytest.mark.parametrize("key", ["resources.nope", "nope.x"])
def test_unknown_nested_keys_are_named(tmp_path, key):
    rc, _, err = _simulate(tmp_path, "--cost", f"{key}=1")
    assert rc == 2 and f"costs.{key.split('.')[0]}" in err and len(err.strip().splitlines()) == 1


def test_roofline_gemm_model_switch_is_accepted_and_typed(tmp_path):
    """`costs.roofline: {gemm_model: false}` (documented in sim.hardware.costs.compute) is a
    config field, typed: the schema refused it as an unknown key."""
    rc, out, err = _simulate(tmp_path, "--cost", "roofline.gemm_model=false")
    assert rc == 0, err
    rc, _, err = _simulate(tmp_path, "--cost", "roofline.gemm_model=3")
    assert rc == 2 and "costs.roofline.gemm_model" in err


def test_topology_oversubscription_below_one_is_refused(tmp_path):
    """A fabric cannot have more uplink than downlink capacity: the topology schema agrees
    with the config's and the builder's bound (>= 1)."""
    from sim.core.errors import TopologyError
    from sim.hardware.topology import Topology

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    spec = yaml.safe_load((root / "topologies" / "dgx-a100.yaml").read_text())
    spec["fabric"] = {**(spec.get("fabric") or {}), "type": "fat_tree", "oversubscription": 0.5}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises((TopologyError, ConfigError), match="oversubscription"):
        Topology.load(str(path), nodes=2)
