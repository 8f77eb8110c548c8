"""PyTorch profiler (Kineto) Chrome-trace JSON of a training step, one file per rank.

What becomes a task, within one `ProfilerStep#N` (the first step every file has, or the one
asked for; the whole file where there is none):
- host threads: the ops directly under the step on its thread, the top-level ops of every
  other thread (autograd, gloo workers, the user's threads with `profile_all_threads`);
- gloo collectives: the `gloo:<collective>` ranges on gloo's worker threads (the transfer),
  each tied to the `c10d::<collective>` op that enqueued it (its sizes, all-to-all splits and
  send/recv peer come from there);
- GPUs: kernels, memcpys and memsets per device stream; NCCL kernels are the collectives
  (type, sizes, splits, group and sequence from their arguments where recorded);
- a host op that blocks on a collective (the gloo transfer ends inside it while the thread
  runs nothing) or on the GPU (a synchronising CUDA call) is cut around the wait, so the
  part after it depends on what it waited for.

Dependencies: program order per thread and device stream, a kernel after the host op that
launched it (by correlation id), a gloo transfer after its enqueue, the host after a blocking
copy (`cudaMemcpy`, by correlation id), and the generic wait inference of
sim.analysis.importers.timeline within each side (host threads, device streams): a host op
waits on device work only after a synchronising call (cudaDeviceSynchronize,
cudaStreamSynchronize, cudaEventSynchronize; the device work that ended last before it
returned), never because a kernel happened to end while the host was idle. Every op is
tagged with its side (`side`: host or device), for what-ifs that scale one and not the other.
The files must be one run's, one per rank, every rank of the recorded world_size (or one
rank's file alone): sim.analysis.importers.kineto_runs. Collectives match across ranks by
(process group, sequence) where the kernel records them, else by type and order of end on
each rank (so concurrent collectives of one type on different subgroups are not told apart).
Times are the files' own clock: ranks profiled on one host share it; across hosts the
replay assumes the clocks agree.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.analysis.importers import kineto_check as kc
from sim.analysis.importers import kineto_names as kn
from sim.analysis.importers import kineto_runs as kr
from sim.analysis.importers.timeline import ORDER_TOL_S, Op, to_graph
from sim.core.errors import ConfigError
from sim.core.graph import TaskGraph

HOST_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"})
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
EXPECTED = "a PyTorch profiler (Kineto) Chrome trace: a JSON object with 'traceEvents'"


def read(path: str | Path) -> dict[str, Any]:
    """The JSON of one trace file (plain or gzipped), checked to be a Kineto trace."""
    p = Path(path)
    raw = kc.inflate(p)  # bounded: a small gzip may inflate without end
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"trace {p}: not valid JSON, truncated? ({e}); expected {EXPECTED}"
        ) from None
    except (ValueError, RecursionError) as e:  # nesting past the parser's limit
        raise ConfigError(f"trace {p}: not a usable JSON document ({e})") from None
    if isinstance(doc, dict) and "schema_version" in doc and "tasks" in doc:
        raise ConfigError(f"trace {p}: is a moesim task graph, not a trace (pass it as --graph)")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ConfigError(f"trace {p}: expected {EXPECTED}")
    # from here on only the checked complete events are read (the others carry nothing used)
    xs = doc["traceEvents"] = kc.events(p, doc)
    if not any(e.get("cat") in HOST_CATS | DEVICE_CATS for e in xs):
        if any(isinstance(e.get("args"), dict) and "kind" in e["args"] for e in xs):
            raise ConfigError(
                f"trace {p}: is moesim's own Chrome export; replay the trace.csv beside it"
            )
        raise ConfigError(
            f"trace {p}: has no profiler ops (cpu_op, kernel, ...); expected {EXPECTED}"
        )
    return doc


def load(
    paths: Sequence[str | Path], step: int | None = None
) -> tuple[TaskGraph, dict[str, tuple[float, float]]]:
    docs = [(Path(p), read(p)) for p in paths]
    ranks = []
    for i, (p, doc) in enumerate(docs):
        r = (doc.get("distributedInfo") or {}).get("rank", i)
        if not isinstance(r, int) or r < 0:
            raise ConfigError(f"trace {p}: distributedInfo.rank {r!r} is not a rank")
        ranks.append(r)
    world_size = kr.one_run(docs, ranks)
    chosen = kr.common_step(docs, step)
    kr.overlapping(docs, ranks, chosen)
    base = min(float(e["ts"]) for _, d in docs for e in d["traceEvents"] if e.get("ph") == "X")
    ops: list[Op] = []
    prev: dict[str, Op] = {}
    for (p, doc), rank in zip(docs, ranks):
        rt = RankTrace(p, doc, rank, chosen, base)
        ops += rt.ops()
        prev.update(rt.prev)
    finish(ops, prev)
    for o in ops:  # members of a matched collective: its group (NCCL) or every file's rank
        if o.match is not None and o.match[0] != "p2p":
            o.members = sorted(set(o.members or ranks) & set(ranks))
    hosts = {d.get("host_name") for _, d in docs}
    meta = {
        "replay_of": [str(p) for p, _ in docs],
        "profiler_step": chosen,
        "clock": "one host" if len(hosts) == 1 else "several hosts: clocks assumed to agree",
        "ranks_recorded": sorted(ranks),
    }
    if world_size is not None:
        meta["world_size_recorded"] = world_size
    world = max(ranks) + 1
    return to_graph(ops, world, f"traces {', '.join(str(p) for p, _ in docs)}", meta)


_steps = kr.steps  # ProfilerStep#N -> its event, of one file


class RankTrace:
    """One rank's file: its ops within the chosen step."""

    def __init__(self, path: Path, doc: dict[str, Any], rank: int, step: int | None, base: float):
        self.path, self.rank, self.base = path, rank, base
        events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
        self.step = _steps(doc).get(step) if step is not None else None
        if self.step is not None:
            lo, hi = self.step["ts"], self.step["ts"] + self.step.get("dur", 0)
        else:
            lo, hi = -float("inf"), float("inf")
        self.window = (lo, hi)
        self.host: dict[Any, list[dict]] = defaultdict(list)
        self.device: dict[tuple, list[dict]] = defaultdict(list)
        for e in events:
            cat = e.get("cat")
            e.setdefault("dur", 0.0)
            if cat in HOST_CATS and e is not self.step:
                self.host[(e.get("pid"), e.get("tid"))].append(e)
            elif cat in DEVICE_CATS:
                args = e.get("args") or {}
                lane = (args.get("device", e.get("pid")), args.get("stream", e.get("tid")))
                self.device[lane].append(e)

    def t(self, us: float) -> float:
        return (float(us) - self.base) * 1e-6

    def ops(self) -> list[Op]:
        self.out: list[Op] = []
        self.by_corr: dict[Any, Op] = {}  # correlation id -> the host task that launched it
        self.sync_corr: dict[Any, Op] = {}  # a blocking copy's correlation -> the host after it
        self.prev: dict[str, Op] = {}  # host task id -> the task before it on its thread
        tops = self._host_tops()
        enq = self._enqueues(tops, self._gloo_ops(tops))
        waits_on = {id(x): g for g, x in enq.values()}  # c10d op -> its gloo transfer
        for lane, items in tops.items():
            self._host_tasks(lane, items, waits_on, {id(g): x for g, x in enq.values()})
        self._device_tasks()
        return self.out

    # -- host ------------------------------------------------------------------------------
    def _host_tops(self) -> dict[str, list[tuple[dict, list[dict]]]]:
        """Per host thread: its top-level ops in the window, each with its descendants."""
        lo, hi = self.window
        step_thread = (self.step.get("pid"), self.step.get("tid")) if self.step else None
        out: dict[str, list[tuple[dict, list[dict]]]] = {}
        for k, (key, evs) in enumerate(sorted(self.host.items(), key=lambda kv: str(kv[0]))):
            evs = sorted((e for e in evs if lo <= e["ts"] < hi), key=lambda e: (e["ts"], -e["dur"]))
            tops: list[tuple[dict, list[dict]]] = []
            end = -float("inf")
            for e in evs:
                if e["ts"] < end and tops:
                    tops[-1][1].append(e)
                else:
                    tops.append((e, []))
                    end = e["ts"] + e["dur"]
            if tops:
                out["main" if key == step_thread else f"t{k}"] = tops
        return out

    def _gloo_ops(self, tops) -> dict[str, list[dict]]:
        """Normalised collective -> gloo transfer ranges on this rank, in start order."""
        out: dict[str, list[dict]] = defaultdict(list)
        for items in tops.values():
            for e, _ in items:
                c = kn.collective_of(e["name"]) if e["name"].startswith("gloo:") else None
                if c:
                    out[c].append(e)
        for v in out.values():
            v.sort(key=lambda e: e["ts"])
        return out

    def _enqueues(self, tops, gloo) -> dict[int, tuple[dict, dict]]:
        """id(gloo range) -> (it, the c10d op that enqueued it): n-th of a kind <-> n-th."""
        c10d: dict[str, list[dict]] = defaultdict(list)
        for items in tops.values():
            for e, kids in items:
                for x in [e, *kids]:
                    if x["name"].startswith("c10d::"):
                        c = kn.collective_of(x["name"])
                        if c:
                            c10d[c].append(x)
        out = {}
        for c, gs in gloo.items():
            for g, x in zip(gs, sorted(c10d.get(c, []), key=lambda e: e["ts"])):
                out[id(g)] = (g, x)
        return out

    def _host_tasks(self, lane: str, items, waits_on, enq) -> None:
        stream_c = "compute" if lane == "main" else f"compute.{lane}"
        prev: Op | None = None
        for n, (e, kids) in enumerate(items):
            name = e["name"]
            coll = kn.collective_of(name) if name.startswith("gloo:") else None
            if coll:
                self._gloo_task(lane, e, enq.get(id(e)))
                continue
            cuts = self._waits(e, kids, waits_on)
            bounds = [e["ts"], *[c for a, b, _, _ in cuts for c in (a, b)], e["ts"] + e["dur"]]
            seg_ops = []
            for j in range(len(cuts) + 1):
                s, t = bounds[2 * j], bounds[2 * j + 1]
                suffix = f"#{j}" if cuts else ""
                op = self._op(f"{lane}/{n}{suffix}", stream_c, kn.compute_kind(name), s, t, e)
                op.lane, op.side = lane, "host"
                awaited = cuts[j - 1][2] if j > 0 else None
                if awaited is not None:
                    op.deps.append(awaited)
                elif j > 0:  # after a synchronising CUDA call: it waited for the device
                    op.syncs = True
                    corr = (cuts[j - 1][3].get("args") or {}).get("correlation")
                    if corr is not None:  # a blocking memcpy: the copy it launched
                        self.sync_corr[corr] = op
                if prev is not None:
                    self.prev[op.id] = prev
                prev = op
                seg_ops.append(op)
                self.out.append(op)
            for x in [e, *kids]:  # which segment each launch and enqueue falls in
                corr = (x.get("args") or {}).get("correlation")
                seg = _segment_at(seg_ops, self.t(x["ts"]))
                if corr is not None and x.get("cat") in ("cuda_runtime", "cuda_driver"):
                    self.by_corr[corr] = seg
                if id(x) in waits_on:
                    x["_task"] = seg.id

    def _waits(self, e, kids, waits_on) -> list[tuple[float, float, str | None, dict]]:
        """(from, to, awaited task id or None, the waiting event) of the waits inside host op
        `e`: gloo's wait on its transfer, and the synchronising CUDA calls."""
        cuts: list[tuple[float, float, str | None, dict]] = []
        for x in kids:
            g = waits_on.get(id(x))
            a = x["ts"] + x["dur"]
            if g is not None:
                b = g["ts"] + g["dur"]
                busy = any(a < y["ts"] < b for y in kids)
                if a < b < e["ts"] + e["dur"] and not busy:
                    cuts.append((a, b, self._gloo_id(g), x))
            elif x.get("cat") == "cuda_runtime" and x["name"] in kn.SYNC_CALLS:
                # what it waited for: the copy it launched (a blocking memcpy), else the
                # device work that ended last before it returned (timeline's inference)
                cuts.append((x["ts"], a, None, x))
        cuts.sort(key=lambda c: c[:2])
        out: list[tuple[float, float, str | None, dict]] = []
        last = e["ts"]
        for c in cuts:  # nested or overlapping waits: keep the first
            if c[0] >= last:
                out.append(c)
                last = c[1]
        return out

    def _gloo_id(self, g: dict) -> str:
        g.setdefault("_id", f"r{self.rank}/gloo{g.get('tid')}@{g['ts']:.3f}")
        return g["_id"]

    def _gloo_task(self, lane: str, g: dict, x: dict | None) -> None:
        c = kn.collective_of(g["name"])
        kind = kn.COLLECTIVES[c]  # type: ignore[index]
        args, xargs = g.get("args") or {}, (x or {}).get("args") or {}
        op = self._op("", f"comm.{lane}", kind, g["ts"], g["ts"] + g["dur"], g)
        op.id, op.lane, op.side = self._gloo_id(g), lane, "host"
        op.bytes = kn.tensor_bytes(args) or kn.tensor_bytes(xargs, 1 if c == "alltoall" else 0)
        if c == "alltoall":
            self._splits(op, xargs)
        if kind in ("send", "recv"):
            op.peer = kn.concrete(xargs, 2) if x is not None else None
            if not isinstance(op.peer, int):
                op.peer = None
        op.match = ("gloo", c)  # numbered in end order by finish()
        op.tags["enqueue"] = x["name"] if x is not None else None
        if x is not None:
            op.tags["_enqueue"] = x
        self.out.append(op)

    def _splits(self, op: Op, xargs: dict[str, Any]) -> None:
        """all_to_all_single's input splits (rows) -> bytes per member (all_to_allv)."""
        splits = kn.concrete(xargs, 4)
        dims = (xargs.get("Input Dims") or [])[1:2] or [[0]]  # the input tensor's dims
        rows = (dims[0] or [0])[0]
        if not (isinstance(splits, list) and all(isinstance(s, int) for s in splits)):
            splits = None  # not recorded, or not the splits: an even exchange
        if splits and isinstance(rows, int) and rows > 0 and len(set(splits)) > 1:
            op.kind = "all_to_allv"
            op.split = [op.bytes * s / rows for s in splits]

    # -- device ----------------------------------------------------------------------------
    def _device_tasks(self) -> None:
        lo, hi = self.window
        launched = set(self.by_corr)
        for (dev, sid), evs in sorted(self.device.items(), key=lambda kv: str(kv[0])):
            lane = f"d{dev}s{sid}"
            for n, e in enumerate(sorted(evs, key=lambda e: e["ts"])):
                args = e.get("args") or {}
                corr = args.get("correlation")
                if corr not in launched and not lo <= e["ts"] < hi:
                    continue
                name, cat = e["name"], e.get("cat")
                if cat == "gpu_memcpy":
                    kind, stream = kn.copy_kind(name), f"copy.{lane}"
                elif cat == "kernel" and kn.is_nccl_kernel(name):
                    kind, stream = "all_to_all", f"comm.{lane}"
                else:
                    kind, stream = kn.compute_kind(name), f"compute.{lane}"
                op = self._op(f"{lane}/{n}", stream, kind, e["ts"], e["ts"] + e["dur"], e)
                op.lane, op.side = lane, "device"
                if cat == "gpu_memcpy":
                    op.bytes = float(args.get("bytes", 0) or 0)
                if stream.startswith("comm"):
                    self._nccl(op, name, args)
                host = self.by_corr.get(corr)
                if host is not None and host.end > op.start:  # still running: the launch is
                    host = self.prev.get(host.id)  # inside it, after its predecessor ended
                if host is not None:
                    op.deps.append(host.id)
                after = self.sync_corr.get(corr)
                if after is not None:  # the host went on once this copy was done
                    after.deps.append(op.id)
                self.out.append(op)

    def _nccl(self, op: Op, name: str, args: dict[str, Any]) -> None:
        info = kn.nccl_info(args)
        c = info.get("collective") or kn.collective_of(name) or "alltoall"
        op.kind = kn.COLLECTIVES[c]
        op.bytes = info.get("bytes", 0.0)
        if op.kind == "all_to_all" and info.get("split") and len(set(info["split"])) > 1:
            op.kind, op.split = "all_to_allv", info["split"]
        op.match = ("nccl", *info["key"]) if "key" in info else ("nccl", c)
        op.members = info.get("group")
        if op.kind in ("send", "recv"):  # peers are not recorded: rank-local replay
            op.match = None

    # -- common ----------------------------------------------------------------------------
    def _op(self, suffix: str, stream: str, kind: str, ts: float, te: float, e: dict) -> Op:
        name = e["name"]
        op = Op(f"r{self.rank}/{suffix} {name}", self.rank, stream, kind, self.t(ts), self.t(te))
        # where it ran: what-ifs scale the device's work and the host's apart
        side = "device" if e.get("cat") in DEVICE_CATS else "host"
        op.tags = {"step": name, "phase": kn.phase_of(name), "side": side}
        if kind == "gemm":
            op.shape, op.flops = kn.gemm_shape(name, e.get("args") or {})
        return op


def _segment_at(segs: list[Op], t: float) -> Op:
    for s in segs:
        if t <= s.end + ORDER_TOL_S:
            return s
    return segs[-1]


def finish(ops: list[Op], prev: dict[str, Op]) -> list[Op]:
    """Cross-op links that need every rank's ops: numbering of collectives by end order,
    gloo transfers after their enqueue, kernels after their launch (see module docstring)."""
    by_id = {o.id: o for o in ops}
    count: dict[tuple, int] = defaultdict(int)
    for o in sorted(ops, key=lambda o: o.end):
        if o.match is not None and len(o.match) == 2:  # (backend, collective): number it
            k = (o.rank, *o.match)
            o.match = (*o.match, count[k])
            count[k] += 1
        x = o.tags.pop("_enqueue", None)
        seg = by_id.get(x.get("_task")) if x is not None else None
        if seg is not None and seg.end > o.start:  # the transfer began before the enqueue
            seg = prev.get(seg.id)  # returned: after the host task before it, then
        if seg is not None:
            o.deps.append(seg.id)
    _pair_p2p(ops)
    return ops


def _pair_p2p(ops: list[Op]) -> None:
    """gloo send/recv: the n-th send from a to b matches the n-th recv on b from a."""
    count: dict[tuple, int] = defaultdict(int)
    for o in sorted(ops, key=lambda o: o.start):
        if o.kind in ("send", "recv"):
            if o.peer is None:
                o.match = None
                continue
            src, dst = (o.rank, o.peer) if o.kind == "send" else (o.peer, o.rank)
            k = (o.kind, src, dst)
            o.match = ("p2p", src, dst, count[k])
            count[k] += 1
