"""What each Parm schedule moves and computes on one rank: the paper's volume analysis (Sec.
IV), in bytes.

Notation (Parm Table I): T = B*L tokens per MP group (the N_MP ranks of an MP group hold the
same T tokens: the dense part is tensor-parallel), E experts over an EP group of N_EP ranks
(E/N_EP each), each expert sliced over an ESP group of N_ESP ranks (H/N_ESP hidden units
each), P = N_EP * N_ESP ranks in the MoE layer, top-k gating with capacity factor f,
C = ceil(k f T / E) slots per (rank, expert). |D| = E * C' * M elements is the dispatch
buffer a rank sends in a schedule, C' its capacity there.

- baseline (DeepSpeed-MoE): gate on T, C' = C. ESP-AllGather of |D| (out N_ESP |D|),
  EP-AlltoAll of N_ESP |D|, experts, ESP-AllReduce of N_ESP |D|, EP-AlltoAll of N_ESP |D|,
  ESP-Split (local). Backward (autograd's adjoints): ESP-AllGather of |D| (the Split's
  gradient, as Sec. IV-A says), EP-AlltoAll, experts, EP-AlltoAll, ESP-ReduceScatter of
  N_ESP |D| (the AllGather's gradient; the AllReduce's is the identity).
- S1 (PauseMP before the gate): MP-Split keeps T/N_MP tokens, gate on them, C' = C1 =
  ceil(k f T / (N_MP E)) (gating, and so dropping, per MP slice); Dump + EP&ESP-AlltoAll of
  N_ESP |D| over all P ranks, experts, EP&ESP-AlltoAll back + local combine, decode, then
  MP-AllGather of (T/N_MP) M. Backward: MP-AllGather's gradient is the local slice, the
  MP-Split's is an MP-AllGather of (T/N_MP) M.
- S2 (PauseMP after the gate): gate on T, MP-Split keeps C/N_MP of the capacity slots
  (C aligned up to a multiple of N_MP, extra slots empty), C' = C/N_MP; Dump + EP&ESP-AlltoAll,
  experts, EP&ESP-AlltoAll + local combine, MP-AllGather of |D| (out N_MP |D|), decode.

Every rank's experts see P * C' rows per local expert in every schedule (the baseline's EP
peers each send their ESP group's N_ESP gathered buffers), with H/N_ESP hidden units.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.errors import ConfigError
from sim.workload.moe import MoELayer, expert_capacity
from sim.workload.slicing import aligned

SCHEDULES = ("baseline", "s1", "s2")


@dataclass(frozen=True)
class Degrees:
    """N_MP, N_EP, N_ESP of one replica (P = N_EP * N_ESP ranks)."""

    mp: int
    ep: int
    esp: int

    @property
    def world(self) -> int:
        return self.ep * self.esp


def check(layer: MoELayer, tp: object, esp: object) -> Degrees:
    """The degrees of a layer on `layer.world` ranks, after checking Parm's layout."""
    for name, v in (("tp", tp), ("esp", esp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"strategy.{name}: expected a positive integer, got {v!r}")
    assert isinstance(tp, int) and isinstance(esp, int)
    P, E, H = layer.world, layer.experts, layer.hidden_dim
    if P % esp:
        raise ConfigError(f"strategy.esp: {P} GPUs do not split into ESP groups of {esp}")
    if P % tp:
        raise ConfigError(f"strategy.tp: {P} GPUs do not split into MP groups of {tp}")
    ep = P // esp
    if E % ep:
        raise ConfigError(
            f"model.experts: every EP group of {ep} GPUs (P/esp) holds all {E} experts, which "
            f"needs E to be a multiple of {ep}"
        )
    if H % esp:
        raise ConfigError(
            f"model.hidden_dim: {H} hidden units do not slice over ESP groups of {esp}"
        )
    return Degrees(tp, ep, esp)


@dataclass(frozen=True)
class Volumes:
    """One rank's sizes in a schedule (bytes unless named otherwise)."""

    schedule: str
    deg: Degrees
    gate_tokens: int  # tokens this rank gates (T, or T/N_MP in S1)
    capacity: int  # C': slots per (rank, expert) this rank sends
    full_capacity: int  # slots of the gated [E, C, M] buffer (S2: C aligned to N_MP)
    buf: float  # |D| bytes: E * C' * M
    tokens_bytes: float  # T * M bytes (the layer's input/output on an MP group)
    rows: int  # rows per local expert: P * C'
    local_experts: int
    hidden: int  # H / N_ESP

    @property
    def a2a(self) -> float:
        """Bytes of each all-to-all's send buffer: N_ESP |D| (EP or EP&ESP alike)."""
        return self.deg.esp * self.buf

    @property
    def mp_gather(self) -> float:
        """The MP-AllGather's input shard: S1 (T/N_MP) M, S2 |D|; 0 in the baseline."""
        if self.deg.mp == 1:  # no MP group: nothing to gather
            return 0.0
        if self.schedule == "s1":
            return self.tokens_bytes / self.deg.mp
        return self.buf if self.schedule == "s2" else 0.0

    def collectives(self, saa: bool = False) -> dict[str, list[tuple[str, str, float]]]:
        """Per pass, the (step, kind, bytes) of every collective in program order (the SAA
        chunks of S2 counted as their sum); a group of one rank runs none."""
        n, d = self.deg.esp, self.buf
        if self.schedule == "baseline" and n == 1:  # no ESP group: plain EP
            a2a = [("dispatch", "all_to_all", d), ("combine", "all_to_all", d)]
            return {
                "fwd": a2a,
                "bwd": [("combine_grad", "all_to_all", d), ("dispatch_grad", "all_to_all", d)],
            }
        if self.schedule == "baseline":
            esp = [("esp_gather", "all_gather", d), ("dispatch", "all_to_all", n * d)]
            fwd = esp + [("esp_reduce", "all_reduce", n * d), ("combine", "all_to_all", n * d)]
            bwd = [
                ("esp_split_grad", "all_gather", d),
                ("combine_grad", "all_to_all", n * d),
                ("dispatch_grad", "all_to_all", n * d),
                ("esp_gather_grad", "reduce_scatter", n * d),
            ]
            return {"fwd": fwd, "bwd": bwd}
        a2a = [("dispatch", "all_to_all", n * d), ("combine", "all_to_all", n * d)]
        grads = [("combine_grad", "all_to_all", n * d), ("dispatch_grad", "all_to_all", n * d)]
        if self.deg.mp == 1:
            return {"fwd": a2a, "bwd": grads}
        fwd = a2a + [("mp_gather", "all_gather", self.mp_gather)]
        bwd = grads + [("mp_split_grad", "all_gather", self.mp_gather)]
        return {"fwd": fwd, "bwd": bwd}


def volumes(layer: MoELayer, deg: Degrees, schedule: str) -> Volumes:
    if schedule not in SCHEDULES:
        raise ConfigError(f"strategy.schedule: expected one of {SCHEDULES}, got {schedule!r}")
    T, E, M, e = layer.tokens, layer.experts, layer.model_dim, layer.elem
    C = layer.capacity
    full = C
    if schedule == "s1":
        if T % deg.mp:
            raise ConfigError(
                f"model: S1 splits the {T} tokens of an MP group (batch x seq_len) over "
                f"{deg.mp} MP ranks (need a multiple of {deg.mp})"
            )
        tokens = T // deg.mp
        if layer.dropless:  # padded to the hottest count, of T/mp tokens each (an even split)
            cap = full = -(-C // deg.mp)
        else:
            cap = full = expert_capacity(tokens, E, layer.top_k, layer.capacity_factor)
    elif schedule == "s2":
        tokens, full = T, aligned(C, deg.mp)
        cap = full // deg.mp
    else:
        tokens, cap = T, C
    return Volumes(
        schedule=schedule,
        deg=deg,
        gate_tokens=tokens,
        capacity=cap,
        full_capacity=full,
        buf=float(E * cap * M * e),
        tokens_bytes=float(T * M * e),
        rows=deg.world * cap,
        local_experts=E // deg.ep,
        hidden=layer.hidden_dim // deg.esp,
    )
