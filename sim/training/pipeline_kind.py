"""Which pipeline schedule a training step runs (the recipe's `pipeline`), where its model
chunks live, and what the schedule's order says of the held activations and the bounds.

- `1f1b`: Megatron-Core's 1F1B, interleaved with `vp` > 1 (`sim.training.pipeline`): `pp`
  stages of `vp` chunks, virtual stage v = c x pp + s on stage s.
- `dualpipe`: DeepSeek-V3's DualPipe (report Sec. 3.2.1, github.com/deepseek-ai/DualPipe;
  the order is `sim.strategies.dualpipe.schedule`'s): `pp` is both its devices and its
  stages. The model is split in `pp` stages, two pipelines of them run in opposite
  directions over the same `pp` devices, device s holding stage h = min(s, pp-1-s) of one
  (its chunk 0) and stage pp-1-h of the other (chunk 1): every stage on two devices, so a
  device keeps two stages' parameters, their gradients and optimizer shards ("2x
  parameters", report Table 2). Each direction carries half the micro-batches (GA even and
  >= 2 pp); pp even.
- `dualpipev`: DualPipeV ("cut-in-half", `dualpipev.py`): `pp` is its devices; the model is
  split in 2 pp stages of one V-shaped pipeline, device s holding stages s (chunk 0) and
  2pp-1-s (chunk 1): the parameters once, as 1F1B. GA >= 2 pp.

Both run with `vp` = 1 and `pp` >= 2; each device runs the published eight steps
(`device_ops`), zero-bubble steps split into input-gradient B and weight-gradient W
(`sim.training.dualpipe_schedule` lays them out). The stages take the even split of the layers
(or the recipe's layout string of `pp` / 2 pp stages). Not modelled: FSDP with DualPipe
(refused), and the exchange that sums the gradients of DualPipe's two copies of a stage
(devices s and pp-1-s, one reduce-scattered shard each way, 1 / DP of the chunk's gradients:
untimed; each copy is reduce-scattered over its DP group and stepped by its own optimizer).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sim.core.errors import ConfigError
from sim.strategies.dualpipe.schedule import Op, Pipeline
from sim.training.ops import LayerWork

PIPELINES = ("1f1b", "dualpipe", "dualpipev")


def check_pipeline(
    kind: str, pp: int, vp: int, ga: int, where: str, fsdp: int = 0, layers: int = 0
) -> None:
    """One-line errors where a layout cannot run `kind` (the field named); `layers`: the
    model's (0: unknown), which every stage needs one of."""
    if kind not in PIPELINES:
        raise ConfigError(f"{where}: pipeline: expected one of {PIPELINES}, got {kind!r}")
    if kind == "1f1b":
        return
    if pp < 2 or (kind == "dualpipe" and pp % 2):
        even = "an even pp >= 2 (two opposite pipelines of pp stages)" if kind == "dualpipe" else ""
        raise ConfigError(
            f"{where}: pipeline: {kind} needs {even or 'pp >= 2 (2 pp stages in a V)'}, got pp={pp}"
        )
    if vp != 1:
        raise ConfigError(
            f"{where}: pipeline: {kind} holds two chunks per device by its own order: needs "
            f"vp=1, got vp={vp}"
        )
    if fsdp:
        raise ConfigError(f"{where}: pipeline: {kind} with FSDP is not modelled (fsdp={fsdp})")
    stages = pp if kind == "dualpipe" else 2 * pp
    if layers and stages > layers:
        raise ConfigError(
            f"{where}: pipeline: {kind} on pp={pp} cuts the model into {stages} stages, more "
            f"than its {layers} layers"
        )
    need = 2 * stages if kind == "dualpipe" else stages
    if ga < need or (kind == "dualpipe" and ga % 2):
        even = " and even" if kind == "dualpipe" else ""
        raise ConfigError(
            f"{where}: pipeline: {kind} on pp={pp} needs >= {need}{even} micro-batches per step "
            f"(ga = gbs / (mbs x dp)), got ga={ga}"
        )
    Pipeline(kind, stages, ga)  # the schedule's own checks agree


def wgrad(gpu: Any, lw: LayerWork, names: list[str]) -> float:
    """Seconds of the weight-gradient GEMMs in the backward of a layer's works `names`: a
    GEMM's backward is its data gradient and its weight gradient, the same FLOPs each
    (`ops.Work.bwd` = 2), so half its backward (`gpu`: `GpuKernels`)."""
    by_name = {w.name: w for w in lw.work}
    gemm = ("gemm", "grouped_gemm")
    return sum(gpu.seconds(by_name[n], True) / 2 for n in names if by_name[n].kind in gemm)


def runs(kind: str, pp: int, vp: int, ga: int, layers: int = 0) -> bool:
    """Whether a layout can run `kind` (`check_pipeline` without the message)."""
    try:
        check_pipeline(kind, pp, vp, ga, "", layers=layers)
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class Placement:
    """The chunks of a layout's pipeline: `kind`, `pp` devices, `vp` chunks (1F1B)."""

    kind: str = "1f1b"
    pp: int = 1
    vp: int = 1

    @property
    def dual(self) -> bool:
        return self.kind != "1f1b"

    @property
    def vstages(self) -> int:
        """Stages the model is split in."""
        return {"dualpipe": self.pp, "dualpipev": 2 * self.pp}.get(self.kind, self.pp * self.vp)

    @property
    def chunks(self) -> int:
        """Chunks per device."""
        return 2 if self.dual else self.vp

    def held_by(self, s: int) -> list[int]:
        """The virtual stages device `s` holds, chunk by chunk (DualPipe's phases)."""
        if self.kind == "dualpipe":
            h = min(s, self.pp - 1 - s)
            return [h, self.pp - 1 - h]
        if self.kind == "dualpipev":
            return [s, 2 * self.pp - 1 - s]
        return [s + c * self.pp for c in range(self.vp)]

    def last(self, s: int) -> bool:
        """Whether device `s` holds the last stage (the LM head and the loss's logits)."""
        return self.vstages - 1 in self.held_by(s)

    def micro_per_chunk(self, ga: int) -> int:
        """Micro-batches each chunk runs in a step (DualPipe: half per direction)."""
        return ga // 2 if self.kind == "dualpipe" else ga

    def pipe(self, ga: int) -> Pipeline:
        """DualPipe's or DualPipeV's schedule (`sim.strategies.dualpipe.schedule.Pipeline`)."""
        return Pipeline(self.kind, self.vstages, ga)

    def first_forward(self, s: int) -> int:
        """Forward chunks of other devices that must run before device `s`'s first one: its
        first op is a forward of its chunk 0, stage h, after stages 0 .. h-1 of it."""
        return self.held_by(s)[0] if self.dual else s

    def fill(self, busy: list[float], forward: float) -> float:
        """Seconds a DualPipe step takes at least without its optimizer: a device computes
        `busy[s]` seconds in all, none of it before its first op, a forward of its chunk 0
        (stage h), can start: after the forwards of stages 0 .. h-1 of that micro-batch, on
        other devices one after the other, each at least `forward` (the lightest forward
        chunk's compute)."""
        return max(b + self.first_forward(s) * forward for s, b in enumerate(busy))

    def held_counts(self, ga: int, s: int) -> tuple[tuple[int, ...], ...]:
        """The distinct numbers of micro-batches each chunk of device `s` holds after each
        forward (DualPipe's; 1F1B's are `memory._held_counts`)."""
        return _dual_held(self.kind, self.vstages, ga, s)

    def groups(
        self, ga: int, s: int, overlap: bool
    ) -> tuple[tuple[tuple[tuple[str, int], ...], int], ...]:
        """Device `s`'s order as ((pass, ...), count) pairs, as `plan_bound.schedule_groups`
        gives 1F1B's: each F or B of a chunk on its own, a pair merged where its EP
        collectives overlap; a zero-bubble B counts whole (its input part and its W add up
        to it)."""
        return _dual_groups(self.kind, self.vstages, ga, s, overlap)


@functools.lru_cache(maxsize=1024)
def _ops(kind: str, stages: int, ga: int, s: int) -> tuple[Op, ...]:
    return tuple(Pipeline(kind, stages, ga).ops(s))


@functools.lru_cache(maxsize=1024)
def _dual_held(kind: str, stages: int, ga: int, s: int) -> tuple[tuple[int, ...], ...]:
    """As `memory._held_counts`: a pair's forward allocates before its backward frees
    (`schedule.activation_peak`)."""
    held = [0, 0]
    seen: set[tuple[int, ...]] = set()
    for op in _ops(kind, stages, ga, s):
        if op[0] in ("F", "FB"):
            held[op[1]] += 1
            seen.add(tuple(held))
        if op[0] == "B":
            held[op[1]] -= 1
        elif op[0] == "FB":
            held[op[2]] -= 1
    return tuple(seen)


@functools.lru_cache(maxsize=1024)
def _dual_groups(
    kind: str, stages: int, ga: int, s: int, overlap: bool
) -> tuple[tuple[tuple[tuple[str, int], ...], int], ...]:
    counts: Counter[tuple[tuple[str, int], ...]] = Counter()
    for op in _ops(kind, stages, ga, s):
        if op[0] == "FB":
            pair = (("F", op[1]), ("B", op[2]))
            if overlap:
                counts[pair] += 1
            else:
                counts[pair[:1]] += 1
                counts[pair[1:]] += 1
        elif op[0] in ("F", "B"):
            counts[((op[0], op[1]),)] += 1
    return tuple(counts.items())
