"""Damaged, foreign or impossible measured traces are one-line errors naming the file, the
event and what was expected (issue 28, item 6): the Kineto importer checks every field it
reads (sim.analysis.importers.kineto_check), replay refuses times no measurement has
(negative durations, a timestamp far from the others, a rank 1.5, a row ending at 1e308 s)
and a collective with a member missing, and an output set is read only whole."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sim.analysis.replay import import_trace
from sim.cli import main
from sim.core.errors import ConfigError
from sim.core.io import OutputSet

TRACES = Path(__file__).resolve().parents[1] / "traces"
EXEC = TRACES / "exec-gloo-2r"
KINETO = TRACES / "kineto-gloo-2r"


def _doc(rank: int) -> dict:
    return json.loads(gzip.decompress((KINETO / f"rank{rank}.json.gz").read_bytes()))


def _op(doc: dict) -> int:
    """Index of a profiler op inside the step (what the importer turns into a task)."""
    return next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "cpu_op")


def _one_line_error(paths: list[Path], match: str) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        import_trace([str(p) for p in paths])
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def _pair(tmp: Path, doc0: dict) -> list[Path]:
    """rank0 as given (written as JSON), rank1 as recorded."""
    p = tmp / "rank0.json"
    p.write_text(json.dumps(doc0))
    return [p, KINETO / "rank1.json.gz"]


def _set(doc: dict, i: int, **fields) -> dict:
    for k, v in fields.items():
        if v is _DROP:
            doc["traceEvents"][i].pop(k, None)
        else:
            doc["traceEvents"][i][k] = v
    return doc


_DROP = object()

# (what is done to one profiler op of rank 0, the error it must give)
EVENT_CASES = {
    "no-ts": (dict(ts=_DROP), r"traceEvents\[\d+\] \('[^']+'\): ts: expected a finite number"),
    "no-name": (dict(name=_DROP), r"traceEvents\[\d+\]: name: expected a string, got nothing"),
    "name-null": (dict(name=None), r"name: expected a string, got None"),
    "ts-string": (dict(ts="12"), r"ts: expected a finite number .*got '12'"),
    "dur-string": (dict(dur="5"), r"dur: expected a finite number >= 0"),
    "tid-list": (dict(tid=[1, 2]), r"tid: expected an integer or string, got \[1, 2\]"),
    "args-list": (dict(args=[1]), r"args: expected an object, got \[1\]"),
    "concrete-int": (dict(args={"Concrete Inputs": 7}), r"args\['Concrete Inputs'\]: expected a"),
    "ts-far": (dict(ts=-1e18), r"events span more than 1 day"),
}


@pytest.mark.parametrize("case", sorted(EVENT_CASES))
def test_bad_event_fields_are_one_line_errors(tmp_path, case):
    fields, match = EVENT_CASES[case]
    doc = _doc(0)
    paths = _pair(tmp_path, _set(doc, _op(doc), **fields))
    msg = _one_line_error(paths, match)
    assert "rank0.json" in msg


def test_non_object_event_and_distributed_info(tmp_path):
    doc = _doc(0)
    doc["traceEvents"].insert(3, "hello")
    _one_line_error(_pair(tmp_path, doc), r"traceEvents\[3\]: expected an event object, got str")
    doc = _doc(0)
    doc["distributedInfo"] = [0]
    _one_line_error(_pair(tmp_path, doc), r"distributedInfo: expected an object, got list")


def test_negated_durations_are_refused(tmp_path):
    doc = _doc(0)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e["dur"] = -e.get("dur", 0)
    _one_line_error(_pair(tmp_path, doc), r"dur: expected a finite number >= 0 .*got -")


def test_garbage_gzip_and_inflation_bound(tmp_path):
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)
    _one_line_error([bad], r"rank0.json.gz: truncated or corrupt gzip")
    # a gzip that inflates past the bound is refused while inflating, not after
    from sim.analysis.importers import kineto_check

    with pytest.raises(ConfigError, match="inflates to over 10000 bytes"):
        kineto_check.inflate(KINETO / "rank0.json.gz", limit=10_000)


def test_a_ranks_collectives_missing_names_the_collective(tmp_path):
    doc = _doc(1)
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name")).startswith("gloo:")
    ]
    p = tmp_path / "rank1.json"
    p.write_text(json.dumps(doc))
    msg = _one_line_error(
        [KINETO / "rank0.json.gz", p], r"collective all_to_all .* on rank\(s\) \[1\]"
    )
    assert "gloo:" in msg


# -- moesim traces -----------------------------------------------------------------------


def _csv(tmp: Path, edit) -> Path:
    df = pd.read_csv(EXEC / "trace.csv")
    df = edit(df)
    p = tmp / "trace.csv"
    df.to_csv(p, index=False)
    return p


def test_impossible_moesim_trace_rows(tmp_path):
    def far(df):
        df.loc[3, "end"] = 1e308
        return df

    _one_line_error([_csv(tmp_path, far)], r"trace.csv: task .* ends 1e\+308 s, more than")

    def half_rank(df):
        df["rank"] = df["rank"].astype(float)
        df.loc[df["rank"] == 1, "rank"] = 1.5
        return df

    _one_line_error([_csv(tmp_path, half_rank)], r"line \d+ \(task .*\): expected rank: a non-neg")

    def no_comm_on_1(df):
        return df[~((df["rank"] == 1) & df["stream"].str.startswith("comm"))]

    _one_line_error(
        [_csv(tmp_path, no_comm_on_1)], r"collective .* has no member on rank\(s\) \[1\]"
    )


# -- output sets ---------------------------------------------------------------------------


def _exec_set(tmp: Path) -> Path:
    out = tmp / "exec-out"
    with OutputSet(out, "exec") as s:
        for name in ("trace.csv", "graph.json", "summary.json"):
            s.write_bytes(name, (EXEC / name).read_bytes())
    return out


def test_replay_of_an_output_set_reads_it_only_whole(tmp_path, capsys):
    out = _exec_set(tmp_path)
    import_trace(str(out))  # whole: replays
    data = (out / "trace.csv").read_bytes()
    (out / "trace.csv").write_bytes(data[: data.rindex(b"\n", 0, len(data) // 2) + 1])
    assert main(["replay", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "trace.csv: changed since the run wrote it" in err and "\n" not in err
    (out / "trace.csv").write_bytes(data)
    (out / "graph.json").unlink()
    _one_line_error([out], r"graph.json: listed in the manifest but missing")
    # a run killed while swapping its files in: no manifest, its staging folder left
    (out / "manifest.json").unlink()
    (out / ".moesim-new-999999999-x").mkdir()
    shutil.copy(EXEC / "graph.json", out / "graph.json")
    _one_line_error([out], r"a partial output set \(no manifest.json")


def test_event_count_is_bounded_by_the_task_limit():
    from sim.core.limits import DEFAULT, applied

    with applied(DEFAULT.merged({"max_tasks": 100})):
        _one_line_error(
            [KINETO / "rank0.json.gz"], r"rank0.json.gz: events: \d+ .*limits.max_tasks"
        )
