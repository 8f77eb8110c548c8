"""MPipeMoE's memory footprint model of one MoE layer on one GPU (paper 001, Sec. II-B, III-D).

Notation (MPipeMoE Table I): B tokens a GPU dispatches (rows of T_I, T_DI, T_DO, T_O), model
dim M, hidden dim H, E experts in total, n micro-batches. Results are in *elements*; multiply
by the element size for bytes.

- Eq. 1, model states: parameters, gradients and Adam's two moments (4x the parameters) of
  the gate (E*M) and the local experts (2*H*M each; the paper has one expert per GPU).
- Eq. 2, activations stashed for the backward: T_I, T_DI, T_DO, T_O of (B, M) and T_M of
  (B, H) (the activation function runs in place and is not counted).
- Eq. 3, temporary buffers of a sequential backward: two adjacent activation gradients.
- Eq. 4, pipelined without reuse: every partition keeps its own slice, so the buffers'
  peak equals the activations' (4BM + BH).
- Eq. 5, what reuse saves: T_M shares one buffer of B/n rows, T_DI and T_DO two each (one
  being communicated while the other is computed on); the same for their gradients.
- Eq. 6, the saving ratio phi over the whole footprint.

`layer_tensors` gives the bytes of each of these tensors on one GPU, the one place every
strategy's builder takes them from (their lifetimes: `sim.strategies.activations`).

Eq. 5 as printed holds for n >= 2; `saving` counts min(2, n) double-buffer slots so that
n = 1 (nothing to share) saves nothing instead of a negative amount.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError


@dataclass(frozen=True)
class Footprint:
    """Elements per GPU: model states, activations and buffers, with and without reuse."""

    model_states: float
    activations: float  # pipelined, no reuse (Eq. 2 = Eq. 4)
    buffers: float  # pipelined, no reuse (Eq. 4)
    saving_act: float  # Eq. 5
    saving_buf: float  # Eq. 5 (= saving_act)

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.buffers

    @property
    def total_reuse(self) -> float:
        return self.total - self.saving_act - self.saving_buf

    @property
    def ratio(self) -> float:
        """Eq. 6: phi."""
        return (self.saving_act + self.saving_buf) / self.total


def _check(**ints: int) -> None:
    for name, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"memory model: {name} must be a positive integer, got {v!r}")


def model_states(E: int, M: int, H: int, local_experts: int = 1) -> float:
    """Eq. 1: 4 * (E*M + 2*H*M) for one expert per GPU; `local_experts` experts generally."""
    _check(E=E, M=M, H=H, local_experts=local_experts)
    return 4.0 * (E * M + local_experts * 2 * H * M)


def activations(B: int, M: int, H: int) -> float:
    """Eq. 2 (and Eq. 4, M_act^pipe): 4*B*M + B*H."""
    _check(B=B, M=M, H=H)
    return 4.0 * B * M + B * H


def buffers_sequential(B: int, M: int, H: int) -> float:
    """Eq. 3: B*M + B*H (two adjacent gradients live at once)."""
    _check(B=B, M=M, H=H)
    return float(B * M + B * H)


def buffers_pipelined(B: int, M: int, H: int) -> float:
    """Eq. 4: M_buf^pipe = M_act^pipe."""
    return activations(B, M, H)


def saving(B: int, M: int, H: int, n: int) -> float:
    """Eq. 5: Delta M_act = Delta M_buf = B * (2M (n-2)/n + H (n-1)/n) for n >= 2."""
    _check(B=B, M=M, H=H, n=n)
    double = min(2, n)
    return B * (2.0 * M * (n - double) / n + H * (n - 1) / n)


def footprint(B: int, M: int, H: int, E: int, n: int, local_experts: int = 1) -> Footprint:
    s = saving(B, M, H, n)
    return Footprint(
        model_states(E, M, H, local_experts),
        activations(B, M, H),
        buffers_pipelined(B, M, H),
        s,
        s,
    )


def saving_ratio(B: int, M: int, H: int, E: int, n: int, local_experts: int = 1) -> float:
    """Eq. 6: phi = (dM_act + dM_buf) / (M_ms + M_act^pipe + M_buf^pipe)."""
    return footprint(B, M, H, E, n, local_experts).ratio


# -- one MoE layer's tensors, as every strategy's builder allocates them ---------------------------
# MPipeMoE Fig. 3 / Table I: the forward writes T_I (the dispatch's input), T_DI (the rows the
# GPU's experts receive), T_M (their hidden rows; the activation runs in place), T_DO (the
# experts' outputs) and T_O (the outputs back at their tokens' GPU), Eq. 2's 4BM + BH; the
# backward writes their gradients dT_O, dT_DO, dT_M, dT_DI, dT_I (Eq. 3-4). The lifetimes every
# builder gives them are `sim.strategies.activations`'.
FORWARD = ("T_I", "T_DI", "T_M", "T_DO", "T_O")
BACKWARD = ("dT_O", "dT_DO", "dT_M", "dT_DI", "dT_I")


def layer_tensors(
    token_rows: float,
    expert_rows: float,
    M: int,
    H: int,
    elem: float,
    *,
    received_rows: float | None = None,
    dispatch_row: float | None = None,
) -> dict[str, float]:
    """Bytes on one GPU of each of the layer's ten tensors. T_I, T_O, dT_O and dT_I hold
    `token_rows` rows of M (B of Eq. 2: the rows the GPU dispatches and gets back), T_DI and
    dT_DI `received_rows` rows of M (default `expert_rows`; DeepEP receives one row per
    (token, GPU) where its experts compute one per (token, expert)), T_DO and dT_DO
    `expert_rows` rows of M, T_M and dT_M `expert_rows` rows of H. With every count B the
    forward's five sum to Eq. 2 (times `elem`) and the backward's to Eq. 4's buffers.
    `dispatch_row`: bytes of a row of T_I and T_DI where the dispatch casts them (DeepEP's
    FP8), else M * elem."""
    row = float(M * elem)
    sent = row if dispatch_row is None else float(dispatch_row)
    got = expert_rows if received_rows is None else received_rows
    io, out, mid = token_rows * row, expert_rows * row, expert_rows * H * elem
    return {
        "T_I": token_rows * sent,
        "T_DI": got * sent,
        "T_M": float(mid),
        "T_DO": out,
        "T_O": io,
        "dT_O": io,
        "dT_DO": out,
        "dT_M": float(mid),
        "dT_DI": got * row,
        "dT_I": io,
    }
