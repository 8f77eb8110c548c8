"""DualPipe's and DualPipeV's per-device order of chunks, where each stage lives, and the
published bubble / memory figures.

A device holds two chunks (phase 0 and 1). DualPipe (DeepSeek-V3 report, Sec. 3.2.1; the
reference code github.com/deepseek-ai/DualPipe `dualpipe.py`): PP devices, two pipelines in
opposite directions of PP stages each; device r holds stage h = min(r, PP-1-r) of one
(phase 0) and stage PP-1-h of the other (phase 1); each direction carries half the
micro-batches. DualPipeV (Sea AI Lab's "cut-in-half", `dualpipev.py`): PP/2 devices, one
V-shaped pipeline of PP stages, device r holding stages r (phase 0) and PP-1-r (phase 1).
Both run the same eight steps per device with H = PP/2 half-ranks, h the device's half
rank and M micro-batches per phase:

  1 nF0 x 2(H-h-1) | 2 (F0 F1) x (h+1) | 3 (B1 W F1) x (H-h-1), B zero-bubble |
  4 (F0&B1 F1&B0) x (M-2H+h+1), the middle device's first F0 / B1 not overlapped |
  5 (B1 F1&B0) x (H-h-1) | 6 (B1 B0) x (h+1), zero-bubble from the middle on |
  7 (W B0) x (H-h-1), B zero-bubble | 8 W x (h+1)

(F: forward chunk; B: backward chunk, with its weight gradients unless zero-bubble, when
they wait in a FIFO for a W; X&Y: two chunks whose computation and communication overlap.)
Written from the published schedule; no code is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError

VARIANTS = ("dualpipe", "dualpipev")

# An op: ("F", phase) | ("B", phase, zero_bubble) | ("W",) | ("FB", f_phase, b_phase)
Op = tuple


def device_ops(H: int, h: int, M: int) -> list[Op]:
    """The eight steps (module docstring) of the device with half rank h."""
    mid = h == H - 1
    ops: list[Op] = [("F", 0)] * (2 * (H - h - 1))
    ops += [("F", 0), ("F", 1)] * (h + 1)
    ops += [("B", 1, True), ("W",), ("F", 1)] * (H - h - 1)
    for i in range(M - 2 * H + h + 1):
        ops += [("F", 0), ("B", 1, False)] if i == 0 and mid else [("FB", 0, 1)]
        ops.append(("FB", 1, 0))
    ops += [("B", 1, False), ("FB", 1, 0)] * (H - h - 1)
    zb = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        ops.append(("B", 1, zb))
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        ops.append(("B", 0, zb))
    ops += [("W",), ("B", 0, True)] * (H - h - 1)
    ops += [("W",)] * (h + 1)
    return ops


@dataclass(frozen=True)
class Pipeline:
    """Stages, devices and micro-batches of a variant."""

    variant: str
    pp: int  # pipeline stages (even)
    micro: int  # micro-batches in all

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"strategy.variant: expected one of {VARIANTS}, got {self.variant!r}")
        if not isinstance(self.pp, int) or isinstance(self.pp, bool) or self.pp < 2 or self.pp % 2:
            raise ConfigError(
                f"strategy.pp: expected an even number of stages >= 2, got {self.pp!r}"
            )
        need = 2 * self.pp if self.variant == "dualpipe" else self.pp
        ok = isinstance(self.micro, int) and not isinstance(self.micro, bool)
        if not ok or self.micro < need or (self.variant == "dualpipe" and self.micro % 2):
            even = " and even" if self.variant == "dualpipe" else ""
            raise ConfigError(
                f"strategy.micro: {self.variant} on {self.pp} stages needs >= {need}{even} "
                f"micro-batches, got {self.micro!r}"
            )

    @property
    def devices(self) -> int:
        return self.pp if self.variant == "dualpipe" else self.pp // 2

    @property
    def directions(self) -> int:
        return 2 if self.variant == "dualpipe" else 1

    @property
    def per_phase(self) -> int:
        """Micro-batches each device's chunk of one phase processes."""
        return self.micro // self.directions

    def half_rank(self, dev: int) -> int:
        return min(dev, self.pp - 1 - dev) if self.variant == "dualpipe" else dev

    def ops(self, dev: int) -> list[Op]:
        return device_ops(self.pp // 2, self.half_rank(dev), self.per_phase)

    def locate(self, direction: int, stage: int) -> tuple[int, int]:
        """(device, phase) holding a stage of a direction's pipeline."""
        phase = 0 if stage < self.pp // 2 else 1
        if self.variant == "dualpipev":
            return (stage if phase == 0 else self.pp - 1 - stage), phase
        return (stage if direction == 0 else self.pp - 1 - stage), phase

    def stage_of(self, dev: int, phase: int) -> tuple[int, int]:
        """(direction, stage) of a device's chunk of a phase."""
        if self.variant == "dualpipev":
            return 0, (dev if phase == 0 else self.pp - 1 - dev)
        h = self.half_rank(dev)
        stage = h if phase == 0 else self.pp - 1 - h
        first_half = dev < self.pp // 2
        return (0 if first_half == (phase == 0) else 1), stage


def activation_peak(ops: list[Op]) -> int:
    """Most micro-batch chunks whose forward is done and backward not (a pair's forward
    allocates before its backward frees)."""
    live = peak = 0
    for op in ops:
        if op[0] in ("F", "FB"):
            live += 1
            peak = max(peak, live)
        if op[0] in ("B", "FB"):
            live -= 1
    return peak


def table(pp: int, F: float, B: float, W: float, FB: float) -> dict[str, dict[str, float]]:
    """The DualPipe README's comparison ("based on the same number of PP stages"): bubble,
    parameters (x one stage's), activations (micro-batch chunks) and devices per method.
    F: forward chunk, B: full backward chunk, W: its weight part, FB: an overlapped pair."""
    half = pp / 2 - 1
    return {
        "1F1B": {"bubble": (pp - 1) * (F + B), "params": 1, "activations": pp, "devices": pp},
        "ZB1P": {
            "bubble": (pp - 1) * (F + B - 2 * W),
            "params": 1,
            "activations": pp,
            "devices": pp,
        },
        "dualpipe": {
            "bubble": half * (FB + B - 3 * W),
            "params": 2,
            "activations": pp + 1,
            "devices": pp,
        },
        "dualpipev": {
            "bubble": half * (FB + B - 3 * W),
            "params": 2,
            "activations": pp + 1,
            "devices": pp // 2,
        },
    }
