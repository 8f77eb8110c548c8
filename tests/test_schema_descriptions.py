"""Every field of every input schema carries a description, so that an editor reading
`moesim schema NAME` shows what a key means, its unit and its default where it hovers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sim.cli import main
from sim.config.input_schemas import INPUTS


def properties(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, property schema) of every property anywhere under `node`: the top level, each
    model in $defs and any schema nested inline (a union member, a dict's values)."""
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            if isinstance(prop, dict):
                yield f"{path}.{name}", prop
        for key, value in node.items():
            yield from properties(value, f"{path}.{key}" if key != "properties" else path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from properties(value, f"{path}[{i}]")


def printed_schema(name: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["schema", name]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", INPUTS)
def test_every_field_has_a_description(name, capsys):
    schema = printed_schema(name, capsys)
    props = dict(properties(schema, name))
    assert props, f"{name}: no properties found"
    missing = sorted(
        p
        for p, prop in props.items()
        if not isinstance(prop.get("description"), str) or not prop["description"].strip()
    )
    assert not missing, f"{name}: {len(missing)} of {len(props)} fields lack a description: " + (
        ", ".join(missing)
    )


def test_walk_reaches_nested_models(capsys):
    """The walk sees the models in $defs (not only the top level)."""
    paths = {p for p, _ in properties(printed_schema("config", capsys), "config")}
    assert "config.topology" in paths
    assert "config.$defs.ModelSpec.top_k" in paths
    assert "config.$defs.CostsRoofline.launch_s" in paths
