"""Reading input files without trusting them: only regular files, bounded size, UTF-8 text,
and YAML with bounded nesting and alias expansion and no duplicate keys.

Every problem is a `ConfigError` of one line that names the file and what was expected, so a
FIFO never hangs a run, a binary file never becomes a UnicodeDecodeError traceback, and a
"billion laughs" alias bomb is refused before anything expands it (an error message that
printed the expanded value would hang just the same).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.core.errors import ConfigError, yaml_problem

if TYPE_CHECKING:
    from yaml import SafeLoader  # imported where a file is read: `import sim` stays light

MAX_INPUT_BYTES = 256 * 2**20  # larger inputs are refused (a 10^6-task graph is ~200 MB)
MAX_DEPTH = 64  # nesting of mappings / sequences in a YAML or JSON input
MAX_NODES = 2_000_000  # YAML nodes after alias expansion (counted, never built)
# a float with an exponent YAML 1.1 reads as a string (`1e-6`, `1.5e3`: it wants a dot and a
# signed exponent, `1.5e+3`), as YAML 1.2 reads it
EXPONENT_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)[eE][-+]?[0-9]+$")

FILE_KINDS = (  # what a path can be besides a regular file, as errors name it
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_bytes(path: str | Path, what: str = "input file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file no larger than `limit`; anything else a ConfigError."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows links: a link to a FIFO is a FIFO
    except FileNotFoundError:
        raise ConfigError(f"{what} {p}: not found") from None
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot be read ({e.strerror or e})") from None
    for test, kind in FILE_KINDS:
        if test(st.st_mode):
            raise ConfigError(f"{what} {p}: is {kind}, expected a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {p}: expected a regular file")
    if st.st_size > limit:
        raise ConfigError(f"{what} {p}: {st.st_size} bytes is over the {limit}-byte input limit")
    try:
        # O_NONBLOCK: should the file have been swapped for a FIFO since the stat, opening it
        # still returns at once instead of waiting for a writer
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{what} {p}: cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {p}: over the {limit}-byte input limit")
    return data


def read_text(path: str | Path, what: str = "input file", limit: int = MAX_INPUT_BYTES) -> str:
    """A regular file's text, which must be UTF-8 (a UTF-8 byte-order mark is allowed)."""
    data = read_bytes(path, what, limit)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ConfigError(f"{what} {path}: is UTF-16 text, expected UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} {path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def load_value(text: str, source: str) -> Any:
    """A value given on the command line (`--param k=v`, `--cost k=v`): an integer or float
    as Python reads it (YAML 1.1 takes `1e-3` for a string), anything else as YAML."""
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if number == number and abs(number) != float("inf") else text
    return load_yaml_text(text, source)


def load_yaml_text(text: str, source: str, libyaml: bool = False) -> Any:
    """YAML with safe types only, refusing duplicate keys, nesting deeper than MAX_DEPTH and
    aliases that would expand past MAX_NODES nodes.

    `libyaml`: parsed by libyaml where PyYAML has it, ~10x faster (a topology preset: ~3 ms
    instead of ~35, most of a small run's own time); any problem there is read again by
    PyYAML's own parser, so that an error reads as it always has. Only for the project's own
    files (the topology presets), which tests read both ways: libyaml accepts some text PyYAML
    refuses (a tab after `key:`, `[a?]`), so an input's parser stays PyYAML."""
    import yaml

    if libyaml and getattr(yaml, "__with_libyaml__", False):
        try:
            return _load(text, source, yaml.CSafeLoader)
        except Exception:  # whatever went wrong, PyYAML's own reading below says it
            pass
    return _load(text, source, yaml.SafeLoader)


def _load(text: str, source: str, base: type[Any]) -> Any:
    import yaml

    try:
        _check_depth(yaml.parse(text, Loader=base), source)
        loader = _Loader(text, base)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_expansion(node, source)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({yaml_problem(e)})") from None
    except _Duplicate as e:
        raise ConfigError(f"{source}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None


class _Duplicate(Exception):
    pass


def load_yaml(
    path: str | Path, what: str = "YAML file", limit: int = MAX_INPUT_BYTES, libyaml: bool = False
) -> Any:
    return load_yaml_text(read_text(path, what, limit), f"{what} {path}", libyaml)


def load_json(path: str | Path, what: str = "JSON file", limit: int = MAX_INPUT_BYTES) -> Any:
    text = read_text(path, what, limit)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{what} {path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{what} {path}: nested too deeply") from None
    except ValueError as e:  # NaN / Infinity literals
        raise ConfigError(f"{what} {path}: {e}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number (JSON inputs must hold finite numbers)")


def _check_depth(events: Any, source: str) -> None:
    """Nesting from the event stream, which PyYAML produces without recursion."""
    import yaml

    depth = 0
    for ev in events:
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                mark = ev.start_mark
                assert mark is not None  # the parser marks every event it emits
                raise ConfigError(
                    f"{source}: nested more than {MAX_DEPTH} levels deep (at line {mark.line + 1})"
                )
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _check_expansion(root: Any, source: str) -> None:
    """Nodes the document would have with every alias expanded, counted over the node graph
    (aliases share nodes) with memoisation, so the count itself stays cheap.

    An alias inside the node it names (`&a [*a]`) makes the graph cyclic: PyYAML builds it
    as a self-containing list, which expands without end, so it is refused here; without the
    check this walk itself would loop forever, growing its stack."""
    import yaml

    size: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are still being counted
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:  # iterative post-order: depth is bounded, but keep clear of recursion
        node, done = stack.pop()
        if id(node) in size:
            continue
        if not done and id(node) in open_:
            # entered again before it was finished: only its own descendants were pushed
            # since it opened, so one of them leads back to it
            m = node.start_mark
            raise ConfigError(
                f"{source}: a YAML alias refers to a node that contains it (a cyclic alias, "
                f"anchored at line {m.line + 1}); anchors may only be reused, not nested in "
                "themselves"
            )
        if isinstance(node, yaml.ScalarNode):
            size[id(node)] = 1
            continue
        kids = (
            [x for pair in node.value for x in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        if done:
            total = 1 + sum(size[id(k)] for k in kids)
            if total > MAX_NODES:
                raise ConfigError(
                    f"{source}: YAML aliases expand to more than {MAX_NODES} nodes (an alias bomb?)"
                )
            size[id(node)] = total
            open_.discard(id(node))
        else:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)


def _make_loader(base: type[Any]) -> type:
    import yaml

    class Loader(base):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        m = key_node.start_mark
                        raise _Duplicate(
                            f"duplicate key {key!r} at line {m.line + 1} (first at line "
                            f"{seen[key].line + 1}); a key may appear once"
                        )
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    break
                seen[key] = key_node.start_mark
            mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
            return mapping

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
    # YAML 1.1 (PyYAML's) made `alpha: 1e-6` the string '1e-6', refused as "not a number";
    # YAML 1.2 and the other readers take it as the float
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))
    return Loader


def _mapping(loader: SafeLoader, node: Any) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    return loader.construct_mapping(node)


_LOADERS: dict[type, type] = {}  # base loader (libyaml's or PyYAML's) -> ours over it


def _Loader(text: str, base: type[Any]) -> Any:  # noqa: N802 - reads as the class it instantiates
    if base not in _LOADERS:
        _LOADERS[base] = _make_loader(base)
    return _LOADERS[base](text)
