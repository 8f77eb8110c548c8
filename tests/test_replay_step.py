"""Replay measures the step (issue 29, item 4): ranks that started apart are aligned at their
first common collective and the skew is left out of the step and of the exposed
communication; no host op waits on device work the trace does not show it waiting for;
what-ifs scale the device's compute and the host's ops apart; a folder of mixed runs, a rank
missing and a communication what-if on one rank's file are one-line errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sim.analysis.importers import kineto
from sim.analysis.replay import replay
from sim.analysis.whatif import whatif
from sim.cli import main
from sim.core.errors import ConfigError

KINETO = Path(__file__).resolve().parents[1] / "traces" / "kineto-gloo-2r"
SKEW_US = 100_000.0  # 100 ms: rank 0's process started this much earlier


def _doc(rank: int) -> dict:
    return json.loads(gzip.decompress((KINETO / f"rank{rank}.json.gz").read_bytes()))


def _write(tmp: Path, name: str, doc: dict) -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return p


def _skewed(tmp: Path) -> list[Path]:
    """The recorded pair with rank 0 started SKEW_US earlier: everything it did before a
    moment where it only waited in its first all-to-all (for rank 1) moves earlier, what
    spans that moment (the step, the wait) is as much longer."""
    doc = _doc(0)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    first = min(e["ts"] for e in xs if e["name"].startswith("gloo:"))
    t = first + 2000.0
    spanning = {e["name"] for e in xs if e["ts"] < t < e["ts"] + e["dur"]}
    assert spanning <= {"ProfilerStep#1", "_AllToAll", "gloo:all_to_all", "PyTorch Profiler (0)"}
    for e in doc["traceEvents"]:
        if "ts" not in e or e["ts"] >= t:
            continue
        if e.get("ph") == "X" and e["ts"] + e["dur"] > t:
            e["dur"] += SKEW_US
        e["ts"] -= SKEW_US
    return [_write(tmp, "rank0.json", doc), KINETO / "rank1.json.gz"]


def _both_running(paths: list[Path]) -> float:
    """The step from the trace's own events: from the moment the last rank began its
    ProfilerStep to the end of the last one, seconds."""
    steps = [kineto._steps(kineto.read(p))[1] for p in paths]
    return (max(s["ts"] + s["dur"] for s in steps) - max(s["ts"] for s in steps)) * 1e-6


def test_start_skew_is_left_out_of_the_step(tmp_path):
    paths = _skewed(tmp_path)
    r = replay(paths)
    s, rep = r.summary, r.summary["replay"]
    step = _both_running(paths)
    assert abs(s["makespan_s"] - step) / step < 0.02  # the bar
    assert rep["measured_step_s"] == pytest.approx(s["makespan_s"], rel=1e-9)
    # the skew is reported apart: the injected 100 ms and the recording's own 5 ms
    assert rep["start_skew_s"] == pytest.approx(SKEW_US * 1e-6 + 0.00536, abs=1e-4)
    assert rep["rank_start_skew_s"]["1"] == 0.0
    assert rep["measured_makespan_s"] > step + SKEW_US * 1e-6  # the files' whole span
    # the same replay as the recording's: the early start is neither step nor communication
    plain = replay(sorted(KINETO.glob("rank*.json.gz"))).summary
    assert s["makespan_s"] == pytest.approx(plain["makespan_s"], rel=1e-9)
    assert s["exposed_comm_s"] == pytest.approx(plain["exposed_comm_s"], rel=1e-6)
    assert s["exposed_comm_s"] < 0.01


# -- one run's files, every rank ---------------------------------------------------------------


def _error(paths, match: str, capsys=None) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        replay([str(p) for p in paths])
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_mixed_runs_and_missing_ranks_are_one_line_errors(tmp_path, capsys):
    rank0 = KINETO / "rank0.json.gz"
    # another run's rank 1: a bigger world
    other = _doc(1)
    other["distributedInfo"]["world_size"] = 3
    p = _write(tmp_path, "other.json", other)
    _error([rank0, p], r"other.json \(rank 1\) is not of the run of .*world_size 2 vs 3")
    # the same world, recorded an hour later
    later = _doc(1)
    for e in later["traceEvents"]:
        if "ts" in e:
            e["ts"] += 3600e6
    p = _write(tmp_path, "later.json", later)
    _error([rank0, p], r"later.json \(rank 1\) starts its ProfilerStep#1 3.6e\+03 s after")
    # a folder of two runs' files: rank 1 twice, named with the files
    folder = tmp_path / "runs"
    folder.mkdir()
    for name, src in (("a0.json.gz", rank0), ("a1.json.gz", KINETO / "rank1.json.gz")):
        (folder / name).write_bytes(src.read_bytes())
    _write(folder, "b1.json", _doc(1))
    assert main(["replay", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "two files of rank 1" in err and "b1.json" in err and "\n" not in err
    # a rank missing from a multi-rank set
    docs = [_doc(0), _doc(1)]
    for d in docs:
        d["distributedInfo"]["world_size"] = 3
    paths = [_write(tmp_path, f"w3-{i}.json", d) for i, d in enumerate(docs)]
    _error(paths, r"rank\(s\) \[2\] of world_size 3 missing")


def test_one_ranks_file_replays_alone_and_refuses_communication_whatifs(capsys):
    one = KINETO / "rank1.json.gz"
    r = replay(one)
    assert "rank(s) [1] of a world of 2" in r.summary["replay"]["note"]
    assert main(["whatif", str(one), "--set", "link.*.bw=*2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "rank(s) [1] of a world of 2" in err and "needs every rank's file" in err
    assert "\n" not in err and "Traceback" not in err
    w = whatif(str(one), ["compute.speed=*2"])  # compute: allowed, with what it cannot do
    assert any("waits for them stay as measured" in n for n in w.after["whatif"]["notes"])


# -- the device's work and the host's ------------------------------------------------------------


def _gpu(tmp: Path) -> list[Path]:
    """One rank on a GPU: a kernel that ends while the host is idle between two ops (no
    synchronisation: the host did not wait for it), then a blocking copy (a sync)."""
    host, dev = {"pid": 100, "tid": 1}, {"pid": 0, "tid": 7}

    def x(name, cat, ts, dur, where, **args):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, **where, "args": args}

    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "traceEvents": [
            x("ProfilerStep#1", "user_annotation", 0, 1000, host),
            x("aten::mm", "cpu_op", 10, 20, host),
            x("cudaLaunchKernel", "cuda_runtime", 15, 5, host, correlation=1),
            x("ampere_sgemm_64x32_nn", "kernel", 40, 100, dev, stream=7, correlation=1),
            x("aten::add", "cpu_op", 200, 30, host),  # late, but not waiting on the GPU
            x("aten::to", "cpu_op", 300, 400, host),
            x("cudaMemcpy", "cuda_runtime", 310, 380, host, correlation=2),
            x(
                "Memcpy DtoH (Device -> Pageable)",
                "gpu_memcpy",
                600,
                80,
                dev,
                stream=7,
                correlation=2,
                bytes=1024,
            ),
        ],
    }
    return [_write(tmp, "gpu.json", doc)]


def test_host_waits_on_the_gpu_only_where_the_trace_synchronises(tmp_path):
    r = replay(_gpu(tmp_path))
    g = r.graph
    side = {t.id: t.tags["side"] for t in g}
    add = next(t for t in g if "aten::add" in t.id)
    assert not [d for d in add.deps if side[d] == "device"]  # the kernel: not awaited
    to = sorted((t for t in g if "aten::to" in t.id), key=lambda t: t.id)
    assert len(to) == 2 and any("Memcpy" in d for d in to[1].deps)  # the copy it blocked on
    assert abs(r.summary["replay"]["error"]) < 1e-9


def test_compute_speed_is_the_gpus_and_host_speed_the_hosts(tmp_path):
    paths = _gpu(tmp_path)

    def busy(w, side):
        sides = {t.id: t.tags["side"] for t in w.after_sim.graph}
        out = []
        for trace in (w.before_trace, w.after_trace):
            rows = trace[trace["id"].map(sides) == side]
            out.append(float(rows["duration"].sum()))
        return out

    w = whatif(paths, ["compute.speed=*0.5"])
    (hb, ha), (db, da) = busy(w, "host"), busy(w, "device")
    assert ha == pytest.approx(hb, rel=1e-9)  # the host's ops as measured
    assert da > db  # the device's work slower
    kernel = w.after_trace.set_index("id").filter(like="sgemm", axis=0)["duration"]
    assert float(kernel.iloc[0]) == pytest.approx(200e-6, rel=1e-6)  # the kernel twice as long
    assert any("host.speed scales those" in n for n in w.after["whatif"]["notes"])
    w = whatif(paths, ["host.speed=*0.5"])
    kernel = w.after_trace.set_index("id").filter(like="sgemm", axis=0)["duration"]
    assert float(kernel.iloc[0]) == pytest.approx(100e-6, rel=1e-6)
    add = w.after_trace.set_index("id").filter(like="aten::add", axis=0)["duration"]
    assert float(add.iloc[0]) == pytest.approx(60e-6, rel=1e-6)
    # a CPU-only trace computes on the host: compute.speed scales it, and says so
    w = whatif(KINETO, ["compute.speed=*2"])
    assert w.after["busy_s"]["compute"] == pytest.approx(w.before["busy_s"]["compute"] / 2)
    assert any("the host computes" in n for n in w.after["whatif"]["notes"])
    with pytest.raises(ConfigError, match="host.speed: scales the host's"):
        whatif(
            {
                "topology": "flat-switch",
                "nodes": 2,
                "strategy": "sequential",
                "model": {
                    "batch": 1,
                    "seq_len": 64,
                    "model_dim": 64,
                    "hidden_dim": 64,
                    "experts_per_gpu": 1,
                },
            },
            ["host.speed=*2"],
        )
