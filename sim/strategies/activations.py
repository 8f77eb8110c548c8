"""Where every MoE layer builder allocates and frees the layer's activations: the ten tensors
of `sim.workload.memory.layer_tensors` (MPipeMoE, Sec. II-B, Eq. 2-4), under one lifetime
rule applied to a rank's tasks by their step tags, so that no two builders count one layer
differently (issue 21: the shared builder counted three tensors, mpipemoe ten).

The rule:
- a forward with a backward after it stashes its five tensors for the backward (Eq. 2):
  each is allocated by its first writer and released when the layer's backward returns, by
  its last task (the gate's gradient, the last reader of T_I). With no forward in the graph
  they are live from the backward's first task;
- a forward alone frees each after its last reader: T_I after the last dispatch, T_DI after
  the last fc1, T_M after the last fc2, T_DO after the last combine, T_O after the decode;
- the backward's gradient buffers are allocated by their first writer and freed after their
  last reader: dT_O (decode_grad) after the last combine gradient, dT_DO (combine_grad) after
  the last fc2 weight gradient, dT_M (fc2_dgrad) after the last fc1 weight gradient, dT_DI
  (fc1_dgrad) after the last dispatch gradient, dT_I (dispatch_grad) after the encode
  gradient. A sequential backward so holds two adjacent gradients at a time (Eq. 3: BM + BH);
  a pipelined one all five once its first dispatch gradient goes out before its last combine
  gradient (Eq. 4; MPipeMoE's alternating order), four when every combine gradient goes
  first (Tutel's order: dT_O is freed before dT_I is written);
- chunks write slices of one tensor: a tensor is one buffer, live from the first chunk's
  write to the last chunk's read (MPipeMoE's pipeline without reuse, the "memory bubbles" of
  its Fig. 6), not a buffer per chunk. MPipeMoE's reuse maps micro-batches onto ring slots
  instead (`buffer`).

"First" and "last" are in stream order: the tasks of one step (every dispatch chunk, every
fc1 chunk, ...) sit on one stream, which runs them in the order given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from sim.core.graph import Task
from sim.workload.memory import BACKWARD, FORWARD

Steps = tuple[str, ...]
# tensor -> (the steps that write it, the steps that read it, the last of them freeing it)
ROLES: dict[str, tuple[Steps, Steps]] = {
    "T_I": (("encode",), ("dispatch",)),
    "T_DI": (("dispatch",), ("fc1",)),
    "T_M": (("fc1",), ("fc2",)),
    "T_DO": (("fc2",), ("combine",)),
    "T_O": (("combine",), ("decode",)),
    "dT_O": (("decode_grad",), ("combine_grad",)),
    "dT_DO": (("combine_grad",), ("fc2_wgrad",)),
    "dT_M": (("fc2_dgrad",), ("fc1_wgrad",)),
    "dT_DI": (("fc1_dgrad",), ("dispatch_grad",)),
    "dT_I": (("dispatch_grad",), ("encode_grad",)),
}
RELEASE: Steps = ("gate_grad",)  # the layer's backward returns: its stash is released
Namer = Callable[[str, Task], str]


def place(
    tasks: Iterable[Task],
    nbytes: dict[str, float],
    passes: Iterable[str],
    roles: Mapping[str, tuple[Steps, Steps]] | None = None,
    release: Steps = RELEASE,
    buffer: Namer | None = None,
    prefix: str = "",
) -> None:
    """Add the layer's allocs and frees to one rank's `tasks` (one layer, each stream's tasks
    in order) by the module's rule. `nbytes`: bytes of each buffer; `buffer(tensor, task)`:
    the buffer a task writes or reads of `tensor` (default the tensor itself; MPipeMoE's
    ring slots otherwise); `roles`: a builder's own step names where they differ from ROLES;
    `prefix`: put before every buffer name (a layer's buffers apart from another's)."""
    roles = {**ROLES, **(roles or {})}
    namer: Namer = buffer or (lambda tensor, _t: tensor)
    todo = list(tasks)
    fwd = [t for t in todo if t.tags.get("phase") == "fwd"]
    bwd = [t for t in todo if t.tags.get("phase") == "bwd"]
    keep = "bwd" in passes and bool(bwd)
    end = (_last(bwd, release, lambda _t: True) or bwd[-1]) if keep else None
    for tensor in FORWARD:
        writes, reads = roles[tensor]
        if fwd:
            for buf, first in _firsts(fwd, writes, tensor, namer).items():
                first.allocs[prefix + buf] = nbytes[buf]
                last = end if end is not None else _reader(fwd, reads, tensor, buf, namer)
                (last or first).frees.append(prefix + buf)
        elif end is not None:  # a backward alone: the forward's stash is live from its start
            head = next((t for t in bwd if not t.deps), bwd[0])
            head.allocs[prefix + tensor] = nbytes[tensor]
            end.frees.append(prefix + tensor)
    if end is None:
        return
    for tensor in BACKWARD:
        writes, reads = roles[tensor]
        for buf, first in _firsts(bwd, writes, tensor, namer).items():
            first.allocs[prefix + buf] = nbytes[buf]
            (_reader(bwd, reads, tensor, buf, namer) or end).frees.append(prefix + buf)


def _firsts(tasks: list[Task], steps: Steps, tensor: str, namer: Namer) -> dict[str, Task]:
    """Each buffer of `tensor` and the first task that writes it."""
    out: dict[str, Task] = {}
    for t in tasks:
        if t.tags.get("step") in steps:
            out.setdefault(namer(tensor, t), t)
    return out


def _reader(tasks: list[Task], steps: Steps, tensor: str, buf: str, namer: Namer) -> Task | None:
    return _last(tasks, steps, lambda t: namer(tensor, t) == buf)


def _last(tasks: list[Task], steps: Steps, match: Callable[[Task], bool]) -> Task | None:
    for t in reversed(tasks):
        if t.tags.get("step") in steps and match(t):
            return t
    return None
