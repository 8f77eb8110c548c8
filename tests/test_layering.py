"""The package layout keeps its seams: no import cycles between modules, each layer of `sim`
imports only the layers below it, and `import sim` stays free of torch.

Imports are read from the source (module level and inside functions alike), so a lazy import
counts: it is still a dependency of the module that makes it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]

# Layers of `sim`, lowest first; a module may import its own layer and the ones before it.
# `sim.config` (the run config) sits above the search; then what one run yields (its trace,
# Chrome trace, summary and size guards), the run pipeline on them (`sim.pipeline`), the
# studies over the pipeline (the rest of `sim.analysis`: compare, sweep, whatif, replay,
# report, ...), `sim.commands` (what the subcommands do), `sim.exports` (what `import sim`
# exports) and the CLI above all. A layer is one package or module, or a tuple of them.
SIM_LAYERS: list[str | tuple[str, ...]] = [
    "sim.core",
    "sim.hardware",
    "sim.workload",
    "sim.engine",
    "sim.strategies",
    "sim.search",
    "sim.config",
    ("sim.analysis.trace", "sim.analysis.chrome", "sim.analysis.summary", "sim.analysis.guards"),
    "sim.pipeline",
    "sim.analysis",
    "sim.commands",
    "sim.exports",
    "sim.cli",
]
MAX_LINES = 420  # "no module over ~400 lines"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("sim", "exec"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in list(ast.walk(tree)):  # `if TYPE_CHECKING:` blocks are for type checkers only
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + [base])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for dep in _imports(path, name, set(mods)):
            # a package's __init__ importing its own submodules is how it exposes them
            if not dep.startswith(name + "."):
                g.add_edge(name, dep)
    return g


def _layer(mod: str) -> int | None:
    for i, layer in enumerate(SIM_LAYERS):
        for prefix in (layer,) if isinstance(layer, str) else layer:
            if mod == prefix or mod.startswith(prefix + "."):
                return i
    return None


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_sim_layers_import_only_downwards():
    bad = []
    for a, b in _graph().edges:
        la, lb = _layer(a), _layer(b)
        if a.startswith("sim.") and b.startswith("exec") and a != "sim.cli":
            bad.append(f"{a} -> {b} (only the CLI reaches exec)")
        elif la is not None and lb is not None and lb > la:
            bad.append(f"{a} -> {b}")
    assert not bad, "upward imports: " + "; ".join(bad)


def test_core_knows_nothing_of_moe():
    words = ("expert", "moe", "token")  # "moesim" (the project) aside
    for p in (ROOT / "sim" / "core").rglob("*.py"):
        code = "\n".join(
            line for line in p.read_text().lower().splitlines() if not line.strip().startswith("#")
        )
        tree = ast.parse(code)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names = {n.replace("moesim", "") for n in names}
        assert not [n for n in names if any(w in n for w in words)], p


def test_no_module_over_the_size_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
