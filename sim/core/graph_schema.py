"""The task graph's JSON schema: each field's type and range, and the fields each kind needs.

A graph from a file (`moesim graph`, an importer, a hand-written test) is checked here before
any task is built: strict types (no bool for a number, no 1.5 for a rank), finite sizes in
range, a GEMM's shape complete (m, n, k, optional batch; positive), an all-to-allv's splits
one per group member, a collective with its group and id, a send/recv with its peer, comm
kinds on comm streams, the tags the engine reads. What relates
tasks to each other or to the world (ranks in range, collectives complete, cycles, deps across
ranks) is `sim.core.graph_checks`, which every graph passes, built or loaded.

TypedDicts rather than models: a graph holds 10^5-10^6 tasks, and validating plain dicts is
about three times faster than building a model per task.
"""

# Annotations evaluated as the classes are made (no `from __future__ import annotations`):
# as strings, pydantic would compile and evaluate each field's at start-up (~1% of a small
# `moesim simulate`). A method returning its own class names it in quotes.

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from sim.core.kinds import (
    ALL_KINDS,
    COLLECTIVE_KINDS,
    COMM_KINDS,
    DTYPES,
    GEMM_DIMS,
    GEMM_LAYOUTS,
    P2P_KINDS,
    SCHEMA_VERSION,
    STREAM_KINDS,
    stream_kind,
)

MAX_BYTES = 2.0**60  # one task's bytes (1 EiB): far past any buffer, far below overflow
MAX_FLOPS = 2.0**80  # one task's flops (~1.2e24)
MAX_DIM = 2**31  # one GEMM dimension

_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
Bytes = Annotated[float, Field(ge=0, le=MAX_BYTES, allow_inf_nan=False)]
Flops = Annotated[float, Field(ge=0, le=MAX_FLOPS, allow_inf_nan=False)]
Dim = Annotated[int, Field(gt=0, le=MAX_DIM)]
Rank = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=4096)]
Scalar = str | bool | int | Annotated[float, Field(allow_inf_nan=False)] | None
Kind = Literal[tuple(sorted(ALL_KINDS))]  # type: ignore[valid-type]
Stream = Annotated[
    str, Field(pattern=r"^(" + "|".join(STREAM_KINDS) + r")(\..+)?$", max_length=256)
]


def _about(text: str) -> Any:
    """A field's description, for TypedDict fields (which take no `= Field(...)`)."""
    return Field(description=text)


class GemmShape(TypedDict):
    """work = batch * m * n * k (PipeMoE Eq. 13); `layout` how the operands are stored."""

    __pydantic_config__ = _CONFIG  # type: ignore[misc]
    m: Annotated[Dim, _about(GEMM_DIMS["m"])]
    n: Annotated[Dim, _about(GEMM_DIMS["n"])]
    k: Annotated[Dim, _about(GEMM_DIMS["k"])]
    batch: NotRequired[Annotated[Dim, _about(GEMM_DIMS["batch"])]]
    layout: NotRequired[
        Annotated[Literal[GEMM_LAYOUTS], _about(GEMM_DIMS["layout"])]  # type: ignore[valid-type]
    ]


def _engine_tags(tags: dict[str, Any]) -> dict[str, Any]:
    """Tags are free scalars (layer, phase, step, chunk, ...) except those the engine reads:
    `dtype` (which peak rate a compute task runs at), `count_bytes` (the count exchange of
    a sized all-to-allv) and DeepEP's `deepep` (which direction) and `node_bytes`."""
    if "dtype" in tags and tags["dtype"] not in DTYPES:
        raise ValueError(f"tags.dtype: expected one of {list(DTYPES)}, got {tags['dtype']!r}")
    if tags.get("deepep") not in (None, "dispatch", "combine"):
        raise ValueError(f"tags.deepep: expected 'dispatch' or 'combine', got {tags['deepep']!r}")
    if "count_bytes" in tags:
        v = tags["count_bytes"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_BYTES:
            raise ValueError(f"tags.count_bytes: expected bytes in [0, 2^60], got {v!r}")
    return tags


# A tag is a scalar, or a list of byte counts: DeepEP's `node_bytes` (what a token owner
# sends each node once, sim.hardware.collectives.deepep_flows) is one per node.
Tags = Annotated[dict[str, Scalar | list[Bytes]], AfterValidator(_engine_tags)]


class TaskFields(TypedDict):
    __pydantic_config__ = _CONFIG  # type: ignore[misc]
    id: Annotated[Name, _about("the task's id, unique in the graph")]
    rank: Annotated[Rank, _about("the rank (GPU) that runs it, below world_size")]
    stream: Annotated[
        Stream,
        _about(
            "the stream it runs on in the order tasks were added: compute, comm or copy, "
            "optionally numbered (comm.1)"
        ),
    ]
    kind: Annotated[
        Kind,
        _about(
            "what it does: a compute kind (gemm, elementwise, attention, ...), a copy (d2h, "
            "h2d, d2d), a collective (all_to_all, all_reduce, ...), send or recv"
        ),
    ]
    deps: NotRequired[
        Annotated[list[Name], _about("ids of tasks, on any stream or rank, it waits for")]
    ]
    flops: NotRequired[Annotated[Flops, _about("floating-point operations (compute); default 0")]]
    bytes: NotRequired[
        Annotated[
            Bytes,
            _about(
                "bytes of memory traffic (compute); the payload this rank sends (collectives, "
                "copies, send/recv); default 0"
            ),
        ]
    ]
    shape: NotRequired[
        Annotated[
            GemmShape | None,
            _about("a gemm's shape: its cost by shape (GEMM model, alpha-beta work m*n*k)"),
        ]
    ]
    group: NotRequired[
        Annotated[
            Annotated[list[Rank], Field(min_length=1)] | None,
            _about("collectives: the ranks of the communicator"),
        ]
    ]
    coll: NotRequired[
        Annotated[
            Name | None,
            _about(
                "collectives and send/recv: an id the same on every member (a send and its "
                "recv), which pairs them up"
            ),
        ]
    ]
    split: NotRequired[
        Annotated[
            list[Bytes] | None,
            _about("all_to_allv: bytes this rank sends to each group member, in group order"),
        ]
    ]
    recv_split: NotRequired[
        Annotated[
            list[Bytes] | None,
            _about("all_to_allv: bytes it expects from each group member, in group order"),
        ]
    ]
    peer: NotRequired[Annotated[Rank | None, _about("send / recv: the rank on the other end")]]
    algo: NotRequired[
        Annotated[
            Name | None,
            _about(
                "collectives: the algorithm (linear, pairwise, 2dh, rail_relay, sized, ring, "
                "hierarchical); default: the kind's own (sim.hardware.collectives)"
            ),
        ]
    ]
    allocs: NotRequired[
        Annotated[
            dict[str, Bytes],
            _about("buffers it allocates, name -> bytes, live until a task frees them"),
        ]
    ]
    frees: NotRequired[Annotated[list[str], _about("names of live buffers it frees")]]
    tags: NotRequired[
        Annotated[
            Tags,
            _about(
                "free scalars (layer, phase, chunk, ...); the engine reads dtype (the peak "
                "rate a compute task runs at) and count_bytes (a sized all-to-allv's count "
                "exchange)"
            ),
        ]
    ]
    sms: NotRequired[
        Annotated[
            Annotated[int, Field(ge=0, le=100_000)],
            _about("SMs the kernel holds from launch to end; default 0: none"),
        ]
    ]
    host_sync: NotRequired[
        Annotated[
            bool,
            _about(
                "the host waits for it to finish before launching anything after it on the "
                "rank; default false"
            ),
        ]
    ]


def _per_kind(t: dict[str, Any]) -> dict[str, Any]:
    """The fields a task's kind needs, and none that only other kinds take."""
    kind = t["kind"]
    given = {k for k, v in t.items() if v is not None}

    def refuse(fields: set[str], why: str) -> None:
        extra = sorted(given & fields)
        if extra:
            raise ValueError(
                f"{', '.join(extra)} {'does' if len(extra) == 1 else 'do'} not apply to {why}"
            )

    if t.get("sms") and kind in ("d2h", "h2d"):
        raise ValueError(f"sms does not apply to a {kind} task (copy engines hold no SMs)")
    if kind != "gemm":  # a gemm without a shape is costed (and run) by its bytes
        refuse({"shape"}, f"a {kind} task (a gemm's shape)")
    if kind in COMM_KINDS and stream_kind(t["stream"]) != "comm":
        raise ValueError(f"{kind} must run on a comm stream, not {t['stream']!r}")
    if kind in COLLECTIVE_KINDS:
        missing = [k for k in ("group", "coll") if k not in given]
        if missing:
            raise ValueError(f"collective {kind} needs {' and '.join(map(repr, missing))}")
        refuse({"peer"}, f"a collective ({kind})")
        n = len(t["group"])
        if kind == "all_to_allv":
            if "split" not in given:
                raise ValueError("all_to_allv needs 'split' with one entry per group member")
            for key in ("split", "recv_split"):
                if key in given and len(t[key]) != n:
                    raise ValueError(
                        f"{key!r} has {len(t[key])} entries for a group of {n}: one per member"
                    )
        else:
            refuse({"split", "recv_split"}, f"{kind} (all_to_allv only)")
    elif kind in P2P_KINDS:
        missing = [k for k in ("peer", "coll") if k not in given]
        if missing:
            raise ValueError(f"{kind} needs {' and '.join(map(repr, missing))}")
        refuse({"group", "split", "recv_split", "algo"}, f"a {kind}")
    else:
        refuse({"group", "coll", "split", "recv_split", "peer", "algo"}, f"a {kind} task")
    return t


Task = Annotated[TaskFields, AfterValidator(_per_kind)]


class GraphMeta(TypedDict, total=False):
    """Free-form, except what a replay's summary or the executor reads back."""

    __pydantic_config__ = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)  # type: ignore[misc]
    strategy: Annotated[Name, _about("the strategy that built the graph")]
    passes: Annotated[list[Literal["fwd", "bwd"]], _about("the passes it holds")]
    degree: Annotated[Dim, _about("the strategy's pipelining degree (capacity chunks)")]
    tp: Annotated[Dim, _about("tensor-parallel ranks that share one replica's tokens")]
    order: Annotated[str, _about("the order chunks are issued in (pipelined: tutel, ...)")]
    layer: Annotated[  # what the graph was built for (the executor's --moe reads it)
        dict[str, Any], _about("the MoE layer it was built for (its sizes and routing)")
    ]


class GraphDoc(TypedDict):
    """A task graph file: `moesim schema graph` prints this as JSON Schema."""

    __pydantic_config__ = _CONFIG  # type: ignore[misc]
    schema_version: Annotated[
        Literal[SCHEMA_VERSION], _about("the graph format's version")  # type: ignore[valid-type]
    ]
    world_size: Annotated[int, Field(ge=1), _about("ranks (GPUs) the graph runs on")]
    meta: NotRequired[
        Annotated[
            GraphMeta | None,
            _about("free-form, except the keys a replay's summary or the executor reads"),
        ]
    ]
    tasks: Annotated[  # an empty graph simulates nothing
        list[Task], Field(min_length=1), _about("the tasks, at least one")
    ]


TASK_KEYS = list(TaskFields.__annotations__)
_ADAPTER: TypeAdapter | None = None


def adapter() -> TypeAdapter:
    """The graph file's validator (built on first use: it costs ~50 ms)."""
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(GraphDoc)
    return _ADAPTER


def locate(raw: Any):
    """For `sim.core.schema.check`: a location under `tasks.<i>` named by the task's id."""

    def name(loc: Sequence[Any]) -> tuple[str, list[str]]:
        rest = [str(x) for x in loc]
        if len(loc) >= 2 and loc[0] == "tasks" and isinstance(loc[1], int):
            tasks = raw.get("tasks") if isinstance(raw, dict) else None
            t = tasks[loc[1]] if isinstance(tasks, list) and loc[1] < len(tasks) else None
            tid = t.get("id") if isinstance(t, dict) else None
            label = f"task {tid!r}" if isinstance(tid, str) else f"tasks[{loc[1]}]"
            return label, rest[2:]
        return "", rest

    return name


def known_keys(loc: list[str]) -> list[str]:
    """Keys allowed at a location, for the "did you mean" of an unknown one."""
    if len(loc) == 2 and loc[0] == "tasks":
        return TASK_KEYS
    if len(loc) == 3 and loc[0] == "tasks" and loc[2] == "shape":
        return ["m", "n", "k", "batch", "layout"]
    if not loc:
        return list(GraphDoc.__annotations__)
    return []
