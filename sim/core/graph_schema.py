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

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from sim.core.kinds import (
    ALL_KINDS,
    COLLECTIVE_KINDS,
    COMM_KINDS,
    P2P_KINDS,
    STREAM_KINDS,
    stream_kind,
)

SCHEMA_VERSION = 1
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")  # == sim.hardware.costs.compute.DTYPE_BYTES
# how a GEMM's operands are stored: A then B, "n" as written, "t" a transposed view
GEMM_LAYOUTS = ("nn", "nt", "tn", "tt")
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


class GemmShape(TypedDict):
    """work = batch * m * n * k (PipeMoE Eq. 13); `layout` how the operands are stored."""

    __pydantic_config__ = _CONFIG  # type: ignore[misc]
    m: Dim
    n: Dim
    k: Dim
    batch: NotRequired[Dim]
    layout: NotRequired[Literal[GEMM_LAYOUTS]]  # type: ignore[valid-type]


def _engine_tags(tags: dict[str, Any]) -> dict[str, Any]:
    """Tags are free scalars (layer, phase, step, chunk, ...) except the two the engine reads:
    `dtype` (which peak rate a compute task runs at) and `count_bytes` (the count exchange of
    a sized all-to-allv)."""
    if "dtype" in tags and tags["dtype"] not in DTYPES:
        raise ValueError(f"tags.dtype: expected one of {list(DTYPES)}, got {tags['dtype']!r}")
    if "count_bytes" in tags:
        v = tags["count_bytes"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_BYTES:
            raise ValueError(f"tags.count_bytes: expected bytes in [0, 2^60], got {v!r}")
    return tags


Tags = Annotated[dict[str, Scalar], AfterValidator(_engine_tags)]


class TaskFields(TypedDict):
    __pydantic_config__ = _CONFIG  # type: ignore[misc]
    id: Name
    rank: Rank
    stream: Stream
    kind: Kind
    deps: NotRequired[list[Name]]
    flops: NotRequired[Flops]
    bytes: NotRequired[Bytes]
    shape: NotRequired[GemmShape | None]
    group: NotRequired[Annotated[list[Rank], Field(min_length=1)] | None]
    coll: NotRequired[Name | None]
    split: NotRequired[list[Bytes] | None]
    recv_split: NotRequired[list[Bytes] | None]
    peer: NotRequired[Rank | None]
    algo: NotRequired[Name | None]
    allocs: NotRequired[dict[str, Bytes]]
    frees: NotRequired[list[str]]
    tags: NotRequired[Tags]
    sms: NotRequired[Annotated[int, Field(ge=0, le=100_000)]]  # SMs reserved (0: none)
    host_sync: NotRequired[bool]  # the host waits for it before launching more (0: no)


def _per_kind(t: dict[str, Any]) -> dict[str, Any]:
    """The fields a task's kind needs, and none that only other kinds take."""
    kind = t["kind"]
    given = {k for k, v in t.items() if v is not None}

    def refuse(fields: set[str], why: str) -> None:
        extra = sorted(given & fields)
        if extra:
            raise ValueError(f"{', '.join(extra)} {'does' if len(extra) == 1 else 'do'} not "
                             f"apply to {why}")

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
    strategy: Name
    passes: list[Literal["fwd", "bwd"]]
    degree: Dim
    tp: Dim
    order: str
    layer: dict[str, Any]  # what the graph was built for (the executor's --moe reads it)


class GraphDoc(TypedDict):
    """A task graph file: `moesim schema graph` prints this as JSON Schema."""

    __pydantic_config__ = _CONFIG  # type: ignore[misc]
    schema_version: Literal[SCHEMA_VERSION]  # type: ignore[valid-type]
    world_size: Annotated[int, Field(ge=1)]
    meta: NotRequired[GraphMeta | None]
    tasks: Annotated[list[Task], Field(min_length=1)]  # an empty graph simulates nothing


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
