"""Hostile input files are refused in one line, before anything hangs or expands."""

from __future__ import annotations

import os
import threading

import pytest

from sim.core.errors import ConfigError
from sim.core.safeload import load_json, load_yaml, load_yaml_text, read_text

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")
)


def _err(fn, *a) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*a)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_plain_yaml_loads():
    got = load_yaml_text("a: 1\nb: [1, 2]\nc: {d: x}\n", "t")
    assert got == {"a": 1, "b": [1, 2], "c": {"d": "x"}}
    assert load_yaml_text("x: &v [1, 2]\ny: *v\n", "t") == {"x": [1, 2], "y": [1, 2]}
    assert load_yaml_text("", "t") is None


@pytest.mark.parametrize("libyaml", [False, True])
def test_exponent_floats_without_a_dot_are_numbers(libyaml):
    """`1e-6` is a float in YAML 1.2 (and in every reader but PyYAML's YAML 1.1): a config
    that writes `alpha: 1e-6` means the number; dotted forms, ints and strings are as before."""
    text = "a: 1e-6\nb: -2E+3\nc: 1.5e3\nd: 12\ne: 1e\nf: e5\ng: '1e-6'\nh: 1_0e2\n"
    got = load_yaml_text(text, "t", libyaml=libyaml)
    assert got == {"a": 1e-6, "b": -2000.0, "c": 1500.0, "d": 12, "e": "1e", "f": "e5"} | {
        "g": "1e-6",
        "h": 1000.0,
    }
    assert isinstance(got["a"], float) and isinstance(got["d"], int)


def test_duplicate_keys_are_refused_with_both_lines():
    msg = _err(load_yaml_text, "nodes: 2\nmodel: {}\nnodes: 3\n", "cfg.yaml")
    assert msg == (
        "cfg.yaml: duplicate key 'nodes' at line 3 (first at line 1); a key may appear once"
    )
    assert "duplicate key 'batch'" in _err(load_yaml_text, "m: {batch: 1, batch: 2}\n", "c")


def test_an_alias_bomb_is_refused_before_it_expands():
    msg = _err(load_yaml_text, BOMB, "bomb.yaml")
    assert "aliases expand to more than" in msg


def test_deep_nesting_is_refused_without_recursion_error():
    assert "nested more than" in _err(load_yaml_text, "[" * 100_000, "deep.yaml")
    assert "nested more than" in _err(
        load_yaml_text, "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 200)), "deep.yaml"
    )


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"\xff\xfea\x00:\x00", "is UTF-16 text, expected UTF-8"),
        (b"a: \x80\x81\n", "not UTF-8 text (byte 0x80 at offset 3)"),
    ],
)
def test_non_utf8_text_is_named(tmp_path, content, expected):
    p = tmp_path / "c.yaml"
    p.write_bytes(content)
    assert expected in _err(read_text, p, "config file")


def test_special_files_are_refused_without_reading(tmp_path):
    assert "is a directory" in _err(read_text, tmp_path, "config file")
    assert "not found" in _err(read_text, tmp_path / "missing.yaml", "config file")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(_err(read_text, fifo, "config file")))
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO hung"
    assert "is a FIFO" in result[0]
    assert "is a character device" in _err(read_text, "/dev/zero", "graph")


def test_size_limit(tmp_path):
    p = tmp_path / "big.json"
    p.write_text("[" + "0," * 100 + "0]")
    assert "over the 64-byte input limit" in _err(load_json, p, "graph", 64)


def test_json_nan_and_depth(tmp_path):
    p = tmp_path / "g.json"
    p.write_text('{"bytes": NaN}')
    assert "NaN is not a number" in _err(load_json, p, "graph")
    p.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in _err(load_json, p, "graph")
    p.write_text('{"a": ')
    assert "not valid JSON" in _err(load_json, p, "graph")


def test_load_yaml_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("a: [1, 2\n")
    assert _err(load_yaml, p, "config file").startswith(f"config file {p}: not valid YAML")


def test_presets_read_by_libyaml_as_by_pyyaml():
    """The shipped topology presets are parsed by libyaml (start-up: `load_yaml_text`'s
    `libyaml`); for them it must give exactly what PyYAML's parser gives."""
    import yaml

    from sim.core import safeload
    from sim.hardware.topology.spec import SHIPPED, list_presets

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the presets are read by PyYAML itself")
    names = list_presets()
    assert names
    for name in names:
        text = read_text(SHIPPED / f"{name}.yaml")
        fast = safeload._load(text, name, yaml.CSafeLoader)
        assert fast == safeload._load(text, name, yaml.SafeLoader), name
        assert repr(fast) == repr(load_yaml_text(text, name, libyaml=True)), name


@pytest.mark.parametrize("text", ["a:\t1\n", "[1.yes?]\n", "|##\n"])
def test_inputs_keep_pyyaml_rules_where_libyaml_is_looser(text):
    """What libyaml accepts but PyYAML refuses stays refused for an input (libyaml reads only
    the shipped presets); with `libyaml`, an error still reads as PyYAML words it."""
    msg = _err(load_yaml_text, text, "cfg.yaml")
    assert msg.startswith("cfg.yaml: not valid YAML (")
    assert _err(load_yaml_text, "a: [1\n", "p", True) == _err(load_yaml_text, "a: [1\n", "p")
