"""The bad-input corpus: valid seed inputs (run configs, topologies, task graphs), mutations of
them, hostile files and command lines, and how to run one case through `moesim` in-process.

Shared by the hypothesis tests (tests/test_bad_inputs.py, a sample in CI) and the fuzz
benchmark (benchmarks/fuzz_inputs.py, thousands of cases). A mutation knows whether it must
be refused ("reject": wrong type, NaN or infinity, a negative size, an unknown key, a missing
required key, a fraction for an integer) or may be valid ("any": zero, a huge number, a
deleted optional key); either way the command must end, in one line, without a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path as FilePath  # `Path` reads as a file here; DocPath below is not
from typing import Any

import yaml

ROOT = FilePath(__file__).resolve().parents[1]

# -- seeds ------------------------------------------------------------------------------------

_MODEL = {
    "batch": 2,
    "seq_len": 256,
    "model_dim": 256,
    "hidden_dim": 512,
    "experts_per_gpu": 1,
    "top_k": 2,
    "capacity_factor": 1.2,
    "dtype": "bf16",
    "routing": {"kind": "zipf", "s": 1.2, "seed": 0},
}

CONFIGS: dict[str, dict[str, Any]] = {
    "pipelined": {
        "topology": "dgx-a100",
        "nodes": 1,
        "model": _MODEL,
        "strategy": {"name": "pipelined", "degree": 2, "order": "tutel"},
        "passes": ["fwd", "bwd"],
        "costs": {
            "compute": "roofline",
            "network": "flow",
            "fidelity": "auto",
            "finish_rtol": 1e-3,
            "alpha": 2e-6,
            "roofline": {"flops_efficiency": 0.7, "mem_efficiency": 0.8, "launch_s": 5e-6},
            "interference": {"compute": {"comm": 0.9}, "comm": {"compute": 0.95}},
            "dispatch": {"stream": 1e-5, "cross": 1e-4},
            "resources": {
                "max_connections": 4,
                "sm_share": 0.8,
                "mem_slope": 0.5,
                "comm_sm_bw": 1.4e10,
                "comm_sm_efficiency": 0.9,
            },
            "symmetry": "auto",
        },
        "output": {"trace_format": "csv", "chrome_trace": False, "max_trace_ranks": 4},
        "limits": {"max_ranks": 1024},
    },
    "layout": {
        "topology": "dgx-a100",
        "nodes": 2,
        "fabric": {"type": "fat_tree", "nodes_per_leaf": 1, "oversubscription": 2.0},
        "parallel": {"ep": 8, "dp": 2},
        "model": {**_MODEL, "routing": {"kind": "uniform"}},
        "strategy": "sequential",
        "passes": "fwd",
    },
    "pipeline": {  # DualPipe's devices from parallel.pp, two replicas
        "topology": "dgx-a100",
        "nodes": 2,
        "parallel": {"ep": 4, "pp": 2, "dp": 2},
        "model": {**_MODEL, "experts_per_gpu": 2, "routing": {"kind": "uniform"}},
        "strategy": {
            "name": "dualpipe",
            "layers": 1,
            "micro": 4,
            "dispatcher": "flex",
            "dispatch_dtype": "fp8",
            "sms": 8,
        },
        "passes": ["fwd", "bwd"],
    },
    "blocks": {  # a transformer of MLA blocks around the MoE layers, shared experts
        "topology": "dgx-a100",
        "nodes": 1,
        "model": {
            **_MODEL,
            "routing": {"kind": "uniform"},
            "blocks": {
                "n": 2,
                "heads": 4,
                "moe_every": 1,
                "first_dense": 0,
                "ffn_hidden": 512,
                "shared": 1,
                "flash": True,
                "mla": {
                    "q_lora_rank": 32,
                    "kv_lora_rank": 16,
                    "qk_nope_head_dim": 8,
                    "qk_rope_head_dim": 4,
                    "v_head_dim": 8,
                },
            },
        },
        "strategy": "sequential",
        "passes": ["fwd", "bwd"],
    },
    "megatron_gqa": {  # Megatron's EP overlap on grouped-query attention blocks
        "topology": "dgx-a100",
        "nodes": 1,
        "model": {
            **_MODEL,
            "routing": {"kind": "uniform"},
            "blocks": {"n": 2, "heads": 4, "kv_heads": 2, "head_dim": 32, "moe_every": 1},
        },
        "strategy": {"name": "megatron_ep", "dispatcher": "flex", "micro": 2},
        "passes": ["fwd", "bwd"],
    },
    "alpha_beta": {
        "topology": "dgx-a100",
        "nodes": 1,
        "model": {k: v for k, v in _MODEL.items() if k != "routing"},
        "strategy": {"name": "mpipemoe", "degree": 2, "reuse": "S1"},
        "passes": ["fwd", "bwd"],
        "costs": {
            "compute": "alpha_beta",
            "alpha_beta": {"gemm": {"alpha": 1e-5, "beta": 1e-13}},
            "network": "collective",
            "collectives": {"all_to_all": [{"ranks": 8, "alpha": 1e-5, "beta": 1e-10}]},
            "jitter": {"quantiles": {"gemm": [0.9, 1.0, 1.3]}, "seed": 0, "replicas": 3},
        },
    },
    "matrix": {
        "topology": "dgx-a100",
        "nodes": 1,
        "model": {
            **{k: v for k, v in _MODEL.items() if k != "experts_per_gpu"},
            "experts": 8,
            "routing": {"kind": "matrix", "tokens": [[64.0] * 8 for _ in range(8)]},
        },
        "strategy": {"name": "tutel", "degree": 2},
    },
}


def seed_topology() -> dict[str, Any]:
    """Every section a topology may have: a node of 4 GPUs, 2 nodes on a fat-tree, GEMM
    alpha-beta and collective fits, dispatch latencies."""
    spec = yaml.safe_load((ROOT / "topologies" / "pipemoe-2080ti.yaml").read_text())
    spec["nodes"] = 2
    spec["fabric"] = {
        "type": "fat_tree",
        "class": "edr",
        "nodes_per_leaf": 1,
        "oversubscription": 2.0,
    }
    spec["gpu"]["dispatch"] = {"stream": 1e-5, "cross": 5e-5}
    spec["gpu"]["roofline"]["launch_s"] = 5e-6
    spec["gpu"]["resources"] = {
        "max_connections": 8,
        "sm_penalty": 0.95,
        "sm_share": 0.7,
        "sm_bw": 5e10,
        "mem_knee": 0.1,
        "mem_slope": 0.5,
    }
    return spec


TOPOLOGY_CONFIG = {
    "topology": "topo.yaml",
    "model": {**_MODEL, "batch": 1},
    "strategy": {"name": "pipelined", "degree": 2},
}


def seed_graph() -> dict[str, Any]:
    """Two ranks; every task field set somewhere: GEMMs with shapes and allocations, an
    all-to-all, an all-to-allv with splits, DeepEP's exchange (its per-node bytes a list
    tag), a send/recv pair, frees, tags."""
    ab = {"group": [0, 1]}
    tasks = [
        {
            "id": "g0",
            "rank": 0,
            "stream": "compute",
            "kind": "gemm",
            "flops": 8.4e6,
            "bytes": 1000.0,
            "shape": {"m": 64, "n": 128, "k": 256, "batch": 2},
            "allocs": {"act0": 4096.0},
            "tags": {"phase": "fwd", "chunk": 0, "dtype": "bf16"},
        },
        {
            "id": "g1",
            "rank": 1,
            "stream": "compute",
            "kind": "gemm",
            "flops": 4.2e6,
            "shape": {"m": 64, "n": 128, "k": 256},
        },
        {
            "id": "a0",
            "rank": 0,
            "stream": "comm",
            "kind": "all_to_all",
            "deps": ["g0"],
            "bytes": 4096.0,
            **ab,
            "coll": "disp",
            "algo": "linear",
            "sms": 4,
        },
        {
            "id": "a1",
            "rank": 1,
            "stream": "comm",
            "kind": "all_to_all",
            "deps": ["g1"],
            "bytes": 4096.0,
            **ab,
            "coll": "disp",
            "algo": "linear",
        },
        {
            "id": "v0",
            "rank": 0,
            "stream": "comm",
            "kind": "all_to_allv",
            **ab,
            "coll": "comb",
            "split": [100.0, 200.0],
            "recv_split": [100.0, 300.0],
        },
        {
            "id": "v1",
            "rank": 1,
            "stream": "comm",
            "kind": "all_to_allv",
            **ab,
            "coll": "comb",
            "split": [300.0, 400.0],
            "recv_split": [200.0, 400.0],
        },
        {
            "id": "d0",
            "rank": 0,
            "stream": "comm",
            "kind": "all_to_allv",
            **ab,
            "coll": "dep",
            "algo": "deepep",
            "split": [0.0, 96.0],
            "recv_split": [0.0, 64.0],
            "tags": {"deepep": "dispatch", "node_bytes": [96.0]},
        },
        {
            "id": "d1",
            "rank": 1,
            "stream": "comm",
            "kind": "all_to_allv",
            **ab,
            "coll": "dep",
            "algo": "deepep",
            "split": [64.0, 0.0],
            "recv_split": [96.0, 0.0],
            "tags": {"deepep": "dispatch", "node_bytes": [64.0]},
        },
        {
            "id": "s0",
            "rank": 0,
            "stream": "comm",
            "kind": "send",
            "peer": 1,
            "coll": "p2p",
            "bytes": 512.0,
        },
        {
            "id": "r1",
            "rank": 1,
            "stream": "comm",
            "kind": "recv",
            "peer": 0,
            "coll": "p2p",
            "bytes": 512.0,
        },
        {
            "id": "e0",
            "rank": 0,
            "stream": "compute",
            "kind": "elementwise",
            "deps": ["v0"],
            "bytes": 64.0,
            "frees": ["act0"],
        },
        {"id": "c0", "rank": 0, "stream": "copy", "kind": "d2h", "deps": ["e0"], "bytes": 256.0},
    ]
    return {
        "schema_version": 1,
        "world_size": 2,
        "meta": {"strategy": "hand-built", "passes": ["fwd"], "note": "corpus"},
        "tasks": tasks,
    }


def seed_calibration() -> dict[str, Any]:
    """A format-2 calibration file with every section, as `moesim calibrate` writes it on an
    A100 (so that applying it to `dgx-a100` raises no foreign-device warning)."""
    fit = {"r2": 0.99, "mean_error": 0.03, "sizes": 5}
    return {
        "format": 2,
        "meta": {
            "backend": "nccl",
            "nprocs": 2,
            "device": "cuda:0",
            "device_type": "cuda",
            "device_name": "NVIDIA A100-SXM4-80GB",
            "torch": "2.4.0",
            "rows": 120,
            "dtypes": ["bf16", "fp32"],
            "stand_ins": {},
        },
        "compute": {
            "gemm": {
                "bf16": {"alpha": 1e-5, "beta": 4e-15, **fit},
                "fp32": {"alpha": 1e-5, "beta": 5e-14, **fit},
            },
            "elementwise": {"alpha": 4e-6, "beta": 1e-12, **fit},
            "d2h": {"alpha": 8e-6, "beta": 4e-11, **fit},
        },
        "collectives": {
            "all_to_all": [{"ranks": 2, "alpha": 2e-5, "beta": 5e-12, "r2": 0.98, "n": 6}],
            "all_gather": [{"ranks": 2, "alpha": 2e-5, "beta": 6e-12, "r2": 0.97, "n": 6}],
        },
        "interference": {
            "compute": {"comm": 0.9, "comm+copy": 0.85},
            "comm": {"compute": 0.95},
            "copy": {"compute": 0.97},
        },
        "dispatch": {
            "stream": {"mean": 6e-6, "median": 5e-6, "n": 40},
            "cross": {"mean": 2e-5, "median": 1.5e-5, "n": 40},
        },
        "gemm_shapes": [
            {
                "batch": 1,
                "m": 64,
                "n": 128,
                "k": 256,
                "dtype": "bf16",
                "layout": "nn",
                "seconds": 1.2e-5,
            }
        ],
        "jitter": {"gemm": [0.98, 1.0, 1.04], "all_to_all": [0.9, 1.0, 1.3]},
    }


# -- mutations --------------------------------------------------------------------------------

# Where anything goes: free-form tags and graph metadata (except the keys the engine reads).
FREE = [r"^tasks\.\d+\.tags\.(?!dtype$|count_bytes$)", r"^meta\.(?!passes)"]
# Mappings whose keys are names the input chooses (a new key with a valid value is valid).
NAMED = [r"^tasks\.\d+\.allocs$"]
# Keys whose deletion must be refused.
REQUIRED = [
    r"^(topology|model)$",
    r"^model\.(batch|seq_len|model_dim|hidden_dim|experts_per_gpu|experts)$",
    r"^model\.routing\.(kind|tokens)$",
    r"^model\.blocks\.(n|heads)$",
    r"^model\.blocks\.mla\.(kv_lora_rank|qk_nope_head_dim|qk_rope_head_dim|v_head_dim)$",
    r"^strategy\.name$",
    r"^costs\.(alpha_beta\.\w+|collectives\.\w+\.\d+)\.(alpha|beta)$",
    r"^costs\.jitter\.quantiles$",
    r"^(name|gpus_per_node|gpu|node|link_classes)$",
    r"^gpu\.(mem_bw|peak_flops|memory_bytes)$",
    r"^gpu\.alpha_beta\.\w+\.(alpha|beta)$",
    r"^collectives\.\w+\.\d+\.(alpha|beta)$",
    r"^link_classes\.\w+\.bw$",
    r"^fabric\.(type|class)$",
    r"^node\.links\.\d+\.(a|b|class)$",
    r"^(schema_version|world_size|tasks)$",
    r"^tasks\.\d+\.(id|rank|stream|kind|group|coll|split|peer)$",
    r"^tasks\.\d+\.shape\.(m|n|k)$",
    r"^compute\.\w+(\.\w+)?\.(alpha|beta)$",
    r"^gemm_shapes\.\d+\.(m|n|k|seconds)$",
    r"^dispatch\.\w+\.(mean|median)$",
]
# Integer fields: a fraction there must be refused, not truncated.
INTEGER = [
    r"^nodes$",
    r"^model\.(batch|seq_len|model_dim|hidden_dim|experts|experts_per_gpu|top_k)$",
    r"^model\.routing\.seed$",
    r"^model\.blocks\.(n|heads|kv_heads|head_dim|moe_every|first_dense|ffn_hidden|shared)$",
    r"^model\.blocks\.mla\.\w+$",
    r"^strategy\.degree$",
    r"^parallel\.\w+$",
    r"^costs\.jitter\.(seed|replicas)$",
    r"^(costs|gpu)\.resources\.max_connections$",
    r"^gpu\.sms$",
    r"^tasks\.\d+\.sms$",
    r"^output\.max_trace_ranks$",
    r"^limits\.\w+$",
    r"^(gpus_per_node|schema_version|world_size)$",
    r"^fabric\.nodes_per_(leaf|unit)$",
    r"^collectives\.\w+\.\d+\.ranks$",
    r"^costs\.collectives\.\w+\.\d+\.ranks$",
    r"^tasks\.\d+\.(rank|peer|group\.\d+)$",
    r"^tasks\.\d+\.shape\.\w+$",
    r"^format$",
    r"^gemm_shapes\.\d+\.(batch|m|n|k)$",
    r"^compute\.\w+(\.\w+)?\.sizes$",
    r"^(collectives\.\w+\.\d+|dispatch\.\w+)\.n$",
]
# Numbers that may be negative: a fit worse than the mean has r2 < 0.
SIGNED = [r"\.r2$"]
# Strings YAML 1.1 may give as booleans, taken as such (`symmetry: on` reads as True).
BOOLISH = [r"^costs\.symmetry$"]

# Strings that may be anything (names, descriptions, where outputs go).
FREE_STRINGS = [
    r"^(name|description)$",
    r"^gpu\.model$",
    r"\.source$",
    r"^output\.dir$",
    r"^tasks\.\d+\.(id|frees\.\d+)$",
]

OPS = (
    "type",
    "nan",
    "inf",
    "negative",
    "fraction",
    "zero",
    "huge",
    "delete",
    "unknown_key",
    "misspell",
    "not_a_mapping",
    "bad_string",
    "empty",
    "duplicate",
)
_WRONG = {"str": "abc", "list": [1, "x"], "dict": {"x": 1}, "bool": True, "num": 5}


@dataclass
class Mutant:
    doc: Any
    path: str
    op: str
    expect: str  # "reject" or "any"


def _matches(patterns: list[str], path: str) -> bool:
    return any(re.search(p, path) for p in patterns)


DocPath = tuple  # keys and indices from the document's root; () is the document itself


def paths(doc: Any, prefix: DocPath = ()) -> list[DocPath]:
    """Every path in `doc`, in a stable order."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*prefix, i))
    return out


def dotted(path: DocPath) -> str:
    return ".".join(map(str, path))


def _get(doc: Any, path: DocPath) -> tuple[Any, Any, Any]:
    """(parent, key, value) of a path; parent None for the document."""
    parent, key, node = None, None, doc
    for key in path:
        parent, node = node, node[key]
    return parent, key, node


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    if isinstance(v, str):
        return "str"
    return "list" if isinstance(v, list) else "dict" if isinstance(v, dict) else "none"


def mutate(seed: Any, where: DocPath, op: str, variant: int = 0) -> Mutant | None:
    """`op` applied at `where` of a copy of `seed`, or None where it does not apply."""
    doc = copy.deepcopy(seed)
    parent, key, value = _get(doc, where)
    path = dotted(where)
    free = _matches(FREE, path)
    kind = _kind(value)

    def put(new: Any) -> None:
        if parent is None:
            nonlocal doc
            doc = new
        else:
            parent[key] = new

    expect = "reject"
    if op == "type":
        choices = [k for k in _WRONG if k != kind and not (kind == "num" and k == "bool")]
        if kind == "none" or not choices:
            return None
        wrong = choices[variant % len(choices)]
        put(copy.deepcopy(_WRONG[wrong]))
        if wrong == "bool" and _matches(BOOLISH, path):
            expect = "any"
    elif op in ("nan", "inf", "negative", "fraction", "zero", "huge"):
        if kind != "num":
            return None
        if op == "nan":
            put(float("nan"))
        elif op == "inf":
            put(float("inf") if variant % 2 == 0 else float("-inf"))
        elif op == "negative":
            put(-abs(value) - 1)
            expect = "any" if _matches(SIGNED, path) else "reject"
        elif op == "fraction":
            if not isinstance(value, int):
                return None
            put(value + 0.5)
            expect = "reject" if _matches(INTEGER, path) else "any"
        elif op == "zero":
            put(0)
            expect = "any"
        else:
            put(10**30 if variant % 2 == 0 else 1e300)
            expect = "any"
    elif op == "delete":
        if parent is None:
            return None
        del parent[key]
        expect = "reject" if _matches(REQUIRED, path) else "any"
    elif op in ("unknown_key", "misspell"):
        if kind != "dict":
            return None
        inner = f"{path}.x" if path else "x"
        free = _matches(FREE, inner) or _matches(NAMED, path)
        if op == "unknown_key":
            value["bogus_key"] = 1
        else:
            keys = [k for k in value if isinstance(k, str) and len(k) > 3]
            if not keys:
                return None
            k = keys[variant % len(keys)]
            value[k[:-2] + k[-1]] = value.pop(k)  # drop the second-to-last letter
    elif op == "bad_string":
        if kind != "str":
            return None
        put("bogus_value" if variant % 2 == 0 else "")
        expect = "any" if _matches(FREE_STRINGS, path) else "reject"
    elif op in ("empty", "duplicate"):
        if kind not in ("list", "dict") or not value:
            return None
        if op == "empty":
            put([] if kind == "list" else {})
        elif kind == "list":
            value.append(copy.deepcopy(value[variant % len(value)]))
        else:
            return None
        expect = "any"
    elif op == "not_a_mapping":
        if parent is not None:
            return None
        put([1, 2, 3] if variant % 2 == 0 else "just a string")
    else:
        raise ValueError(op)
    return Mutant(doc, path, op, "any" if free else expect)


# -- files and cases --------------------------------------------------------------------------


@dataclass
class Case:
    """A command line to run in a fresh directory holding `files` (name -> bytes, or a
    special: "fifo", "dir", "sparse:<bytes>", "link:<target>")."""

    name: str
    argv: list[str]
    files: dict[str, Any] = field(default_factory=dict)
    expect: str = "reject"

    def materialise(self, where: FilePath) -> None:
        for name, content in self.files.items():
            p = where / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if content == "fifo":
                os.mkfifo(p)
            elif content == "dir":
                p.mkdir()
            elif isinstance(content, str) and content.startswith("sparse:"):
                with open(p, "wb") as f:
                    f.truncate(int(content.split(":", 1)[1]))
            elif isinstance(content, str) and content.startswith("link:"):
                os.symlink(content.split(":", 1)[1], p)
            else:
                p.write_bytes(content)


def yaml_bytes(doc: Any) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


def json_bytes(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # NaN / Infinity written as JSON's non-standard literals


def config_case(name: str, doc: Any, expect: str = "reject") -> Case:
    return Case(
        name,
        ["simulate", "cfg.yaml", "--out", "out", "--json"],
        {"cfg.yaml": yaml_bytes(doc)},
        expect,
    )


def topology_case(name: str, doc: Any, expect: str = "reject", show: bool = False) -> Case:
    files = {"topo.yaml": yaml_bytes(doc), "cfg.yaml": yaml_bytes(TOPOLOGY_CONFIG)}
    argv = (
        ["topology", "show", "topo.yaml", "--routes"]
        if show
        else ["simulate", "cfg.yaml", "--out", "out", "--json"]
    )
    return Case(name, argv, files, expect)


def graph_case(name: str, doc: Any, expect: str = "reject") -> Case:
    argv = [
        "simulate",
        "g.json",
        "--topology",
        "dgx-a100",
        "--nodes",
        "1",
        "--out",
        "out",
        "--json",
    ]
    return Case(name, argv, {"g.json": json_bytes(doc)}, expect)


def calibration_case(name: str, doc: Any, expect: str = "reject") -> Case:
    files = {"cal.yaml": yaml_bytes(doc), "cfg.yaml": yaml_bytes(CONFIGS["pipelined"])}
    argv = ["simulate", "cfg.yaml", "--calibration", "cal.yaml", "--out", "out", "--json"]
    return Case(name, argv, files, expect)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")
)


def hostile_cases() -> list[Case]:
    """Files no input should be: FIFOs, directories, devices, binary, UTF-16, alias bombs,
    deep nesting, duplicate keys, huge or empty files; and command lines that make no sense."""
    cfg = yaml_bytes(CONFIGS["pipelined"])
    small = {"cfg.yaml": cfg}
    out: list[Case] = []
    sim = ["simulate", "cfg.yaml", "--out", "out"]
    for what, argv, name in (
        ("config", sim, "cfg.yaml"),
        ("graph", ["simulate", "cfg.json", "--topology", "dgx-a100"], "cfg.json"),
        ("topology", ["topology", "show", "cfg.yaml"], "cfg.yaml"),
        (
            "calibration",
            ["simulate", "ok.yaml", "--calibration", "cfg.yaml", "--out", "out"],
            "cfg.yaml",
        ),
        (
            "replay_calibration",
            ["simulate", "g.json", "--topology", "dgx-a100", "--calibration", "cfg.yaml"],
            "cfg.yaml",
        ),
    ):
        base = {"ok.yaml": cfg} if what == "calibration" else {}
        if what == "replay_calibration":
            base = {"g.json": json_bytes(seed_graph())}
        for label, content in (
            ("fifo", "fifo"),
            ("directory", "dir"),
            ("binary", bytes(range(256)) * 4),
            ("utf16", cfg.decode().encode("utf-16")),
            ("latin1", "name: caf\xe9\n".encode("latin-1")),
            ("empty", b""),
            ("sparse_300MB", "sparse:300000000"),
            ("dangling_link", "link:nowhere.yaml"),
            ("self_link", f"link:{name}"),
            ("deep_nesting", b"[" * 100_000),
            ("deep_mapping", "".join(" " * i + "a:\n" for i in range(200)).encode()),
            ("alias_bomb", BOMB.encode()),
            ("duplicate_key", cfg + b"\nnodes: 3\n" if what != "graph" else b'{"a": 1, "a": 2}'),
            ("not_yaml", b"{[}: :\n\t- ::"),
            ("scalar", b"42\n"),
        ):
            files = {**base, name: content}
            out.append(Case(f"{what}_{label}", list(argv), files))
        out.append(Case(f"{what}_missing", list(argv), dict(base)))
    out.append(Case("config_dev_zero", ["simulate", "/dev/zero"], {}))
    out.append(Case("graph_dev_zero", ["simulate", "/dev/zero.json", "--topology", "dgx-a100"]))
    out.append(
        Case(
            "bomb_at_nodes",
            sim,
            {
                "cfg.yaml": (BOMB + yaml_bytes({**CONFIGS["pipelined"], "nodes": "PLACE"}).decode())
                .replace("PLACE", "*i")
                .encode()
            },
        )
    )
    out.append(
        Case(
            "bomb_at_passes",
            sim,
            {
                "cfg.yaml": (
                    BOMB + yaml_bytes({**CONFIGS["pipelined"], "passes": "PLACE"}).decode()
                )
                .replace("PLACE", "*h")
                .encode()
            },
        )
    )
    out.append(
        Case(
            "graph_nan_literal",
            ["simulate", "g.json", "--topology", "dgx-a100"],
            {"g.json": json_bytes(seed_graph()).replace(b"1000.0", b"NaN")},
        )
    )
    out.append(
        Case(
            "graph_trailing_garbage",
            ["simulate", "g.json", "--topology", "dgx-a100"],
            {"g.json": json_bytes(seed_graph()) + b" }"},
        )
    )
    out.append(
        Case(
            "graph_deep_json",
            ["simulate", "g.json", "--topology", "dgx-a100"],
            {"g.json": b"[" * 100_000 + b"]" * 100_000},
        )
    )
    out.append(
        Case(
            "routing_file_fifo",
            sim,
            {
                "m.csv": "fifo",
                "cfg.yaml": yaml_bytes(
                    {
                        **CONFIGS["matrix"],
                        "model": {
                            **CONFIGS["matrix"]["model"],
                            "routing": {"kind": "matrix", "file": "m.csv"},
                        },
                    }
                ),
            },
        )
    )
    for label, content in (
        ("object", b'{"a": 1}'),
        ("nan", b"[[NaN, 1]]"),
        ("ragged", b"[[1, 2], [3]]"),
        ("strings", b'[["a"]]'),
        ("huge", b"[[1e300]]"),
        ("negative", b"[[-1]]"),
    ):
        out.append(
            Case(
                f"routing_file_{label}",
                sim,
                {
                    "m.json": content,
                    "cfg.yaml": yaml_bytes(
                        {
                            **CONFIGS["matrix"],
                            "model": {
                                **CONFIGS["matrix"]["model"],
                                "routing": {"kind": "matrix", "file": "m.json"},
                            },
                        }
                    ),
                },
            )
        )
    out += _routing_cases(sim)
    out += [Case(n, a, dict(small)) for n, a in _bad_command_lines()]
    return out


def _npz(**arrays: Any) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _routing_cases(sim: list[str]) -> list[Case]:
    """Routings of sim.workload.routing: router maps that are not, targets that cannot be
    realised, contradictions; each refused in one line naming the field or file."""
    import numpy as np

    base = CONFIGS["matrix"]

    def cfg(routing: Any, **model: Any) -> bytes:
        m = {**base["model"], "routing": routing, **model}
        return yaml_bytes({**base, "model": {k: v for k, v in m.items() if v is not None}})

    replay = {"kind": "replay", "file": "m.npz"}
    P, E = 8, 8  # CONFIGS["matrix"]: 8 GPUs, one expert each
    bomb = io.BytesIO()
    np.savez_compressed(bomb, counts=np.zeros((64, 64, 256, 256), dtype=np.int64))
    maps = {
        "not_a_zip": b"PK\x03\x04 not really",
        "text": b"counts = [[1, 2]]",
        "pickled": _npz(counts=np.array([{"a": 1}], dtype=object)),
        "floats": _npz(counts=np.ones((1, 1, P, E))),
        "wrong_shape": _npz(counts=np.ones((1, 1, P + 1, E), dtype=np.int64)),
        "negative": _npz(counts=-np.ones((1, 1, P, E), dtype=np.int64)),
        "bad_sums": _npz(counts=np.ones((1, 1, P, E), dtype=np.int64)),
        "unknown_array": _npz(counts=np.ones((1, 1, P, E), dtype=np.int64), extra=np.ones(2)),
        "bomb": bomb.getvalue(),
    }
    out = [
        Case(f"routing_map_{k}", sim, {"m.npz": v, "cfg.yaml": cfg(replay)})
        for k, v in maps.items()
    ]
    out.append(Case("routing_map_fifo", sim, {"m.npz": "fifo", "cfg.yaml": cfg(replay)}))
    out.append(Case("routing_map_missing", sim, {"cfg.yaml": cfg(replay)}))
    bad = {
        "lognormal_unreachable": {"kind": "lognormal", "gpu": {"max_mean": 9.0}},
        "lognormal_two_measures": {"kind": "lognormal", "gpu": {"max_mean": 2.0, "gini": 0.2}},
        "lognormal_no_level": {"kind": "lognormal", "seed": 1},
        "lognormal_nodes_do_not_divide": {
            "kind": "lognormal",
            "node": {"max_mean": 1.5},
            "gpus_per_node": 3,
        },
        "lognormal_drift_steps": {
            "kind": "lognormal",
            "gpu": {"max_mean": 2.0},
            "drift": 0.5,
            "step": 2**30,
        },
        "imbalance_unknown": {"kind": "imbalance", "workload": "W9"},
        "imbalance_field_of_other_kind": {"kind": "imbalance", "workload": "W1", "s": 1.2},
        "replay_step_past_end": {**replay, "step": 3},
    }
    files = {"m.npz": _npz(counts=np.full((1, 1, P, E), 2 * 2 * 256 // E, dtype=np.int64))}
    out += [Case(f"routing_{k}", sim, {**files, "cfg.yaml": cfg(v)}) for k, v in bad.items()]
    out.append(
        Case(
            "routing_dropless_with_capacity_factor",
            sim,
            {"cfg.yaml": cfg({"kind": "uniform"}, dropless=True, capacity_factor=1.5)},
        )
    )
    return out


def _bad_command_lines() -> list[tuple[str, list[str]]]:
    sim = ["simulate", "cfg.yaml", "--out", "out"]
    return [
        ("nodes_zero", sim + ["--nodes", "0"]),
        ("nodes_negative", sim + ["--nodes", "-3"]),
        ("nodes_huge", sim + ["--nodes", "1000000000"]),
        ("nodes_100k", sim + ["--nodes", "100000"]),
        ("nodes_not_int", sim + ["--nodes", "2.5"]),
        ("param_not_yaml", sim + ["--param", "degree=["]),
        ("param_no_equals", sim + ["--param", "degree"]),
        ("param_wrong_type", sim + ["--param", "degree=abc"]),
        ("param_list", sim + ["--param", "degree=[1, 2]"]),
        ("param_unknown", sim + ["--param", "depth=3"]),
        ("param_bomb", sim + ["--param", "degree=" + BOMB.replace("\n", "\n")]),
        ("strategy_unknown", sim + ["--strategy", "bogus"]),
        ("limit_zero", sim + ["--limit", "max_ranks=0"]),
        ("limit_unknown", sim + ["--limit", "max_rank=10"]),
        ("limit_small", sim + ["--limit", "max_tasks=10"]),
        ("replay_strategy", ["simulate", "cfg.json", "--topology", "dgx-a100", "--strategy", "x"]),
        ("replay_no_topology", ["simulate", "cfg.json"]),
        (
            "compare_param",
            [
                "compare",
                "cfg.yaml",
                "--strategies",
                "sequential",
                "--param",
                "degree=2",
                "--out",
                "cmp",
            ],
        ),
        (
            "compare_bad_entry",
            ["compare", "cfg.yaml", "--strategies", "pipelined:degree=x", "--out", "cmp"],
        ),
        ("topology_list_nodes", ["topology", "list", "--nodes", "3"]),
        ("topology_show_no_name", ["topology", "show"]),
        ("topology_nodes_huge", ["topology", "show", "dgx-a100", "--nodes", "10000000"]),
        ("out_proc", ["simulate", "cfg.yaml", "--out", "/proc/x"]),
        ("out_dev_null", ["simulate", "cfg.yaml", "--out", "/dev/null/x"]),
        ("out_is_file", ["simulate", "cfg.yaml", "--out", "cfg.yaml"]),
        ("out_long_name", ["simulate", "cfg.yaml", "--out", "x" * 300]),
        ("graph_out_empty", ["graph", "cfg.yaml", "-o", ""]),
        ("graph_out_dir", ["graph", "cfg.yaml", "-o", "."]),
        ("collectives_factor_one", ["collectives", "-b", "1K", "-e", "1M", "-f", "1"]),
        ("collectives_factor_zero", ["collectives", "-f", "0"]),
        ("collectives_min_zero", ["collectives", "-b", "0", "-e", "1K"]),
        ("collectives_min_over_max", ["collectives", "-b", "1M", "-e", "1K"]),
        ("collectives_bad_size", ["collectives", "-b", "1X"]),
        ("collectives_over_nan", ["collectives", "--oversubscription", "nan"]),
        ("collectives_over_switch", ["collectives", "--oversubscription", "2"]),
        ("collectives_bad_algo", ["collectives", "--algo", "bogus"]),
        ("collectives_nodes_zero", ["collectives", "--nodes", "0"]),
        ("collectives_ring_16k", ["collectives", "--nodes", "2048", "-c", "all_reduce"]),
        ("degree_huge", sim + ["--param", "degree=1048576"]),
        ("experts_huge", sim + ["--nodes", "100", "--param", "degree=2"]),
        ("unknown_command", ["frobnicate"]),
        ("unknown_option", ["simulate", "cfg.yaml", "--frobnicate"]),
        ("abbreviated_option", ["simulate", "cfg.yaml", "--str", "sequential"]),
        ("schema_unknown", ["schema", "bogus"]),
        ("cost_nested_unknown", sim + ["--cost", "resources.nope=1"]),
        ("cost_nested_wrong_type", sim + ["--cost", "resources.max_connections=many"]),
        ("cost_nested_under_scalar", sim + ["--cost", "network.flow=1"]),
        ("cost_nested_deep", sim + ["--cost", "a." * 200 + "b=1"]),
        ("cost_nested_empty_part", sim + ["--cost", "resources..max_connections=1"]),
        ("graph_no_output", ["graph", "cfg.yaml"]),
    ]


def _kineto(edit: Any) -> bytes:
    """The recorded rank-0 Kineto trace with `edit(doc, first_cpu_op)` applied."""
    import gzip

    doc = json.loads(gzip.decompress((ROOT / "traces/kineto-gloo-2r/rank0.json.gz").read_bytes()))
    op = next(e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "cpu_op")
    edit(doc, op)
    return json.dumps(doc).encode()


def fault_cases() -> list[Case]:
    """Issue 28's surfaces: cyclic YAML aliases through every reader, special files as output
    targets, nulls where a mapping or list belongs, whatif and sweep values that make no
    sense, report and replay inputs cut short or impossible, Kineto events with fields of the
    wrong kind, and a group too large for memory."""
    cfg = CONFIGS["pipelined"]
    ok = {"cfg.yaml": yaml_bytes(cfg)}
    cyc = b"a: &a [*a]\n"
    sim = ["simulate", "cfg.yaml", "--out", "out"]
    g = seed_graph()
    clash = copy.deepcopy(g)
    clash["tasks"] += [
        {
            "id": f"ar{r}",
            "rank": r,
            "stream": "comm.b",
            "kind": "all_reduce",
            "group": [0, 1],
            "coll": "p2p",
            "bytes": 64.0,
        }
        for r in (0, 1)
    ]
    head = "run_id,config,strategy,status,error,makespan_s,time_per_token_s,tokens,gpus\n"
    rows = head + "".join(
        f"r{i},c,{s},ok,,{t},{t / 8192},8192,16\n"
        for i, (s, t) in enumerate(
            (
                ("sequential", 0.013),
                ("pipelined:degree=2", 0.0104),
                ("tutel", 0.012),
                ("pipemoe", 0.011),
            )
        )
    )
    csv = rows.encode()
    k1 = (ROOT / "traces/kineto-gloo-2r/rank1.json.gz").read_bytes()
    replay = ["replay", "rank0.json", "rank1.json.gz"]

    def kineto(name: str, edit: Any) -> Case:
        return Case(f"kineto_{name}", replay, {"rank0.json": _kineto(edit), "rank1.json.gz": k1})

    def whatif(*sets: str) -> list[str]:
        return ["whatif", "cfg.yaml", *(x for v in sets for x in ("--set", v))]

    return [
        # one safe loader: a cyclic alias is refused wherever YAML is read
        Case("cycle_config", sim, {"cfg.yaml": yaml_bytes(cfg) + b"output: &a [*a]\n"}),
        Case("cycle_param", sim + ["--param", "degree=&a [*a]"], ok),
        Case("cycle_cost", sim + ["--cost", "finish_rtol=&a [*a]"], ok),
        Case(
            "cycle_compare_entry",
            ["compare", "cfg.yaml", "--strategies", "pipelined:degree=&a [*a]"],
            ok,
        ),
        Case(
            "cycle_sweep",
            ["sweep", "s.yaml", "--out", "sw"],
            {**ok, "s.yaml": b"base: cfg.yaml\ngrid: &a {nodes: [*a]}\n"},
        ),
        Case("cycle_calibration", sim + ["--calibration", "c.yaml"], {**ok, "c.yaml": cyc}),
        Case("cycle_topology", sim + ["--topology", "./t.yaml"], {**ok, "t.yaml": cyc}),
        Case("cycle_merge_key", sim, {"cfg.yaml": yaml_bytes(cfg) + b"x: &a {<<: *a}\n"}),
        # an output never replaces what is not a regular file
        Case("graph_out_fifo", ["graph", "cfg.yaml", "-o", "f"], {**ok, "f": "fifo"}),
        Case("graph_out_link", ["graph", "cfg.yaml", "-o", "l"], {**ok, "l": "link:cfg.yaml"}),
        Case(
            "collectives_out_fifo",
            [
                "collectives",
                "--topology",
                "dgx-a100",
                "--nodes",
                "1",
                "-b",
                "1K",
                "-e",
                "4K",
                "--out",
                "f",
            ],
            {"f": "fifo"},
        ),
        Case("draw_fifo", ["topology", "show", "dgx-a100", "--draw", "f"], {"f": "fifo"}),
        # null is not "left out"
        *(
            config_case(f"null_{k.replace('.', '_')}", doc)
            for k, doc in (
                ("strategy", {**cfg, "strategy": None}),
                ("passes", {**cfg, "passes": None}),
                ("output.dir", {**cfg, "output": {"dir": None}}),
                (
                    "fabric.oversubscription",
                    {**CONFIGS["layout"], "fabric": {"oversubscription": None}},
                ),
            )
        ),
        graph_case("p2p_shares_collective_id", clash),
        # values no machine has
        Case("whatif_nodes_overflow", whatif("nodes=1e400"), ok),
        Case("whatif_nodes_nan", whatif("nodes=nan"), ok),
        Case("whatif_speed_inf", whatif("compute.speed=inf"), ok),
        Case("whatif_speed_tiny_factor", whatif("compute.speed=*1e-300"), ok),
        Case("whatif_bw_inf", whatif("link.*.bw=inf"), ok),
        Case(
            "whatif_graph_nodes_zero",
            [
                "whatif",
                "g.json",
                "--topology",
                "dgx-a100",
                "--nodes",
                "0",
                "--set",
                "compute.speed=*2",
            ],
            {"g.json": json_bytes(g)},
        ),
        Case("whatif_out_under_file", whatif("compute.speed=*2") + ["--out", "cfg.yaml/x"], ok),
        Case(
            "sweep_grid_inf",
            ["sweep", "s.yaml", "--out", "sw"],
            {**ok, "s.yaml": b"base: cfg.yaml\ngrid: {nodes: [.inf]}\n"},
        ),
        Case(
            "sweep_speed_zero",
            ["sweep", "s.yaml", "--out", "sw"],
            {**ok, "s.yaml": b"base: cfg.yaml\ngrid: {compute.speed: [0]}\n"},
        ),
        Case(
            "compare_empty_param",
            ["compare", "cfg.yaml", "--strategies", "pipelined:degree=4,,"],
            ok,
        ),
        Case("collectives_size_inf", ["collectives", "-b", "infK"]),
        Case("collectives_sendrecv_algo", ["collectives", "-c", "sendrecv", "--algo", "bogus"]),
        Case("too_large_group", sim + ["--strategy", "megatron_ep", "--nodes", "512"], ok),
        # reports and replays of what cannot be a run
        Case("report_cut_mid_row", ["report", "r.csv"], {"r.csv": csv[: len(csv) * 2 // 3]}),
        Case("report_short_row", ["report", "r.csv"], {"r.csv": csv + b"r9,c,x,ok\n"}),
        Case("report_timelines_negative", ["report", "r.csv", "--timelines", "-1"], {"r.csv": csv}),
        Case(
            "replay_out_under_file",
            ["replay", "t.csv", "--out", "t.csv/x"],
            {"t.csv": (ROOT / "traces/exec-gloo-2r/trace.csv").read_bytes()},
        ),
        Case(
            "kineto_gzip_garbage",
            replay,
            {"rank0.json": b"", "rank1.json.gz": b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4},
        ),
        kineto("no_ts", lambda d, e: e.pop("ts")),
        kineto("name_null", lambda d, e: e.update(name=None)),
        kineto("ts_string", lambda d, e: e.update(ts="12")),
        kineto("dur_negative", lambda d, e: e.update(dur=-5.0)),
        kineto("tid_list", lambda d, e: e.update(tid=[1, 2])),
        kineto("args_list", lambda d, e: e.update(args=[1])),
        kineto("concrete_inputs_int", lambda d, e: e["args"].update({"Concrete Inputs": 7})),
        kineto("ts_far_past", lambda d, e: e.update(ts=-1e18)),
        kineto("entry_not_object", lambda d, e: d["traceEvents"].insert(0, "hello")),
        kineto("distributed_info_list", lambda d, e: d.update(distributedInfo=[0])),
    ]


def extreme_cases() -> list[Case]:
    """Valid inputs at the edges of their ranges: each must end in time, and with finite
    numbers if it runs."""
    big = {
        **_MODEL,
        "batch": 2**20,
        "seq_len": 2**24,
        "model_dim": 2**24,
        "hidden_dim": 2**24,
        "capacity_factor": 1e4,
    }
    many_experts = {**_MODEL, "experts_per_gpu": 2**16, "routing": "uniform"}
    slow = seed_topology()
    for c in slow["link_classes"].values():
        c.update(bw=1e3, latency=0.999, msg_cost=0.999)
    flops = seed_graph()
    flops["tasks"][0].update(flops=2.0**80, bytes=2.0**60)
    flops["tasks"][6]["bytes"] = flops["tasks"][7]["bytes"] = 2.0**60
    return [
        config_case("extreme_model", {**CONFIGS["pipelined"], "model": big}, "any"),
        config_case(
            "extreme_experts",
            {
                **CONFIGS["layout"],
                "parallel": None,
                "nodes": 1,
                "fabric": None,
                "model": many_experts,
            },
            "any",
        ),
        config_case(
            "extreme_matrix",
            {
                **CONFIGS["matrix"],
                "model": {
                    **CONFIGS["matrix"]["model"],
                    "routing": {"kind": "matrix", "tokens": [[2.0**53] * 8] * 8},
                },
            },
            "any",
        ),
        topology_case("extreme_slow_links", slow, "any"),
        graph_case("extreme_sizes", flops, "any"),
    ]


EX = ("exec", "--out", "o")  # exec keeps a measurement only where asked (refuses without)


def exec_cases() -> list[Case]:
    """The executor's options (needs torch; each starts no process, or fails before it does)."""
    cfg = {
        "cfg.yaml": yaml_bytes({**CONFIGS["pipelined"], "topology": "localhost-cpu"}),
        "g.json": json_bytes(seed_graph()),
    }
    return [
        Case("exec_nprocs_zero", [*EX, "g.json", "--nprocs", "0"], cfg),
        Case("exec_timeout_negative", [*EX, "g.json", "--nprocs", "2", "--timeout", "-1"], cfg),
        Case("exec_timeout_nan", [*EX, "g.json", "--nprocs", "2", "--timeout", "nan"], cfg),
        Case("exec_warmup_negative", [*EX, "g.json", "--nprocs", "2", "--warmup", "-1"], cfg),
        Case("exec_nccl_without_gpus", [*EX, "g.json", "--nprocs", "2", "--backend", "nccl"], cfg),
        Case("exec_world_mismatch", [*EX, "g.json", "--nprocs", "3"], cfg),
        Case("exec_graph_strategy", [*EX, "g.json", "--nprocs", "2", "--strategy", "x"], cfg),
        Case("exec_fifo", [*EX, "f.json", "--nprocs", "2"], {**cfg, "f.json": "fifo"}),
        Case("exec_no_out", ["exec", "g.json", "--nprocs", "2"], cfg),
    ]


def _table(rows: list[dict[str, str]]) -> bytes:
    cols = list(PREDICT_ROW)
    lines = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
    return ("\n".join(lines) + "\n").encode()


# one published-style row of `moesim predict` (a Llama 3 8B run on one DGX H100: fast)
PREDICT_ROW = {
    "release": "25.11",
    "system": "DGX-H100",
    "model": "LLAMA3_8B",
    "variant": "",
    "gpus": "8",
    "precision": "FP8-CS",
    "gbs": "16",
    "mbs": "1",
    "seq_len": "8192",
    "fsdp": "0",
    "tp": "1",
    "pp": "1",
    "cp": "1",
    "vp": "",
    "ep": "1",
    "ga": "",
    "tokens_per_s_per_gpu": "14451",
    "routing_max_mean": "",
}
PREDICT_BAD_CELLS = ("", "-1", "0", "nan", "inf", "1e30", "2.5", "abc", "1e9", "\u00e9", "8" * 40)


def predict_cases() -> list[Case]:
    """`moesim predict` tables: a file it cannot read as a table is refused in one line
    (exit 2); a bad cell gives its row a reason and the others their predictions (exit 0,
    no traceback, no non-finite number)."""
    pr = ["predict", "t.csv", "--json"]
    good = _table([PREDICT_ROW])
    cases = [
        Case("predict_empty", pr, {"t.csv": b""}),
        Case("predict_header_only", pr, {"t.csv": good.split(b"\n")[0] + b"\n"}),
        Case("predict_missing_columns", pr, {"t.csv": b"system,model\nDGX-H100,LLAMA3_8B\n"}),
        Case("predict_not_utf8", pr, {"t.csv": b"\xff\xfe" + good}),
        Case("predict_fifo", pr, {"t.csv": "fifo"}),
        Case("predict_dir", pr, {"t.csv": "dir"}),
        Case("predict_missing_file", pr, {}),
        Case("predict_row_zero", [*pr, "--row", "0"], {"t.csv": good}),
        Case("predict_row_past_end", [*pr, "--row", "2"], {"t.csv": good}),
        Case("predict_out_is_a_file", [*pr, "--out", "t.csv"], {"t.csv": good}),
    ]
    for col in PREDICT_ROW:
        if col in ("release", "variant", "tokens_per_s_per_gpu"):
            continue
        rows = [{**PREDICT_ROW, col: v} for v in PREDICT_BAD_CELLS] + [PREDICT_ROW]
        cases.append(Case(f"predict_cells_{col}", pr, {"t.csv": _table(rows)}, "any"))
    return cases


# a small `moesim plan` request (Llama 3 8B on one DGX H100: under a second)
PLAN = ["plan", "LLAMA3_8B", "--system", "DGX-H100", "--gpus", "8", "--gbs", "16"]
PLAN_SEQ = ["--seq-len", "8192"]
# a request of an MoE model, whose layouts take the dispatcher's options
PLAN_MOE = ["plan", "Qwen3_30B_A3B", "--system", "DGX-H100", "--gpus", "8", "--gbs", "16"]


def plan_cases() -> list[Case]:
    """`moesim plan` requests: every bad option value is refused in one line (exit 2) before
    any candidate is simulated; a given layout that cannot be built is reported in the plan
    (exit 0)."""
    base = [*PLAN, *PLAN_SEQ]

    def with_(option: str, value: str, argv: list[str] | None = None) -> list[str]:
        a = list(argv or base)
        if option in a:
            a[a.index(option) + 1] = value
            return a
        return [*a, option, value]

    bad = {
        "model": ["NOPE", ""],
        "--system": ["NOPE", ""],
        "--precision": ["XYZ", "NVFP4", ""],  # NVFP4: no fp4 GEMMs on an H100
        "--gpus": ["0", "-1", "7", "nan", "2.5", "1e9", "8" * 40],
        "--gbs": ["0", "-3", "inf", "9" * 12],
        "--seq-len": ["0", "-1", "abc"],
        "--workers": ["0", "-1", "x"],
        "--top": ["-1", "x"],
        "--release": ["24.01", "nonsense"],  # no recipe recorded for that release
        "--scheduler": ["nonsense", ""],
        "--layout": [
            "tp",
            "=",
            "foo=1",
            "tp=0",
            "tp=1.5",
            "tp=nan",
            "tp=1,tp=2",
            "overlap=maybe",
            "fsdp=2",
            "recompute=x",
            "dispatcher=x",
            "sms=-1",
            "sms=24",  # a dense model: no dispatcher to hold SMs
            "offload=-1",
            "offload=999",  # the model has 32 layers
            "offload=4,pp=2",  # Megatron-Core offloads only without a pipeline
            "recompute=full,recompute_layers=0",  # N < 1
            "recompute=full,recompute_layers=x",
            "recompute_layers=2",  # N without recompute=full
            "recompute=selective,recompute_layers=2",
            "recompute=full,recompute_layers=33",  # a chunk of PP 1 holds the 32 layers
            "recompute=full,pp=2,vp=2,recompute_layers=9",  # chunks of 8 layers
        ],
        "--grid": [
            "=",
            "tp=",
            "foo=1",
            "tp=0",
            "tp=x",
            "tp=1e40",
            "recompute=x",
            "dispatcher=x",
            "offload=999",
        ],
    }
    cases = []
    for option, values in bad.items():
        for i, v in enumerate(values):
            argv = [*PLAN[:1], v, *PLAN[2:], *PLAN_SEQ] if option == "model" else with_(option, v)
            cases.append(Case(f"plan_{option.strip('-')}_{i}", argv))
    moe = [*PLAN_MOE, "--seq-len", "4096"]
    cases += [
        Case("plan_grid_twice", [*base, "--grid", "tp=1", "--grid", "tp=2"]),
        Case("plan_grid_sms_over", [*moe, "--grid", "comm_sms=100000"]),
        Case("plan_layout_sms_not_deepep", [*moe, "--layout", "ep=8,sms=24,dispatcher=alltoall"]),
        Case("plan_layout_sms_over", [*moe, "--layout", "ep=8,sms=132,dispatcher=deepep"]),
        # Megatron-Core refuses its EP overlap with a plain 1F1B pipeline / full recomputation
        Case("plan_layout_overlap_1f1b", [*moe, "--layout", "pp=2,ep=4,overlap=on"]),
        Case("plan_layout_overlap_full", [*moe, "--layout", "ep=8,overlap=on,recompute=full"]),
        Case("plan_missing_seq_len", list(PLAN)),
        Case("plan_out_is_a_file", [*base, "--out", "f"], {"f": b"x"}),
        Case("plan_top_zero", [*base, "--top", "0"], expect="any"),
        Case("plan_layout_not_built", [*base, "--layout", "tp=3"], expect="any"),
    ]
    return cases


# -- running one case -------------------------------------------------------------------------


class Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Timeout


@dataclass
class Outcome:
    rc: int | None
    stdout: str
    stderr: str
    raised: str = ""  # an exception that escaped main(): its type and message
    timed_out: bool = False

    def verdict(self, expect: str) -> str:
        """traceback | hang | nonsense_accepted | nonfinite_output | memory_error |
        messy_rejection | clean_rejection | accepted."""
        if self.timed_out:
            return "hang"
        if self.raised or "Traceback" in self.stderr:
            return "traceback"
        if self.rc == 0:
            if re.search(r"\b(NaN|-?Infinity)\b", self.stdout):
                return "nonfinite_output"
            return "nonsense_accepted" if expect == "reject" else "accepted"
        if "out of memory" in self.stderr:
            return "memory_error"
        lines = self.stderr.strip().splitlines()
        if self.rc == 2 and len(lines) == 1 and lines[0].startswith("moesim: error: "):
            return "clean_rejection"
        return "messy_rejection"


@contextlib.contextmanager
def _cwd(where: FilePath) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(where)
    try:
        yield
    finally:
        os.chdir(old)


def run_case(case: Case, where: FilePath, timeout_s: float = 30.0) -> Outcome:
    """`moesim <case.argv>` in-process in `where` (created and filled), with an alarm."""
    from sim.cli import main

    where.mkdir(parents=True, exist_ok=True)
    case.materialise(where)
    out, err = io.StringIO(), io.StringIO()
    rc: int | None = None
    raised, timed_out = "", False
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with _cwd(where), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(case.argv))
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=err)
    except Timeout:
        timed_out = True
    except BaseException as e:  # noqa: BLE001 - the point is to catch what escapes
        raised = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # main() installs its own
    return Outcome(rc, out.getvalue(), err.getvalue(), raised, timed_out)
