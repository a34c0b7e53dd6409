"""The typed events of ``events.jsonl`` (nnwatch.store.events): what a producer builds is what a
reader gets back, the lines keep the keys and values they always had, and a line from another
version, an unknown one or a damaged one is read without an error and kept whole."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nnwatch.store.clean_text import clean_value
from nnwatch.store.event_tail import EventTail
from nnwatch.store.events import (
    CommandApplied,
    Event,
    FindingEvent,
    LogFailed,
    OtherEvent,
    RunEnded,
    SnapshotFailed,
    SnapshotTaken,
    StepSkipped,
    TrainingError,
    parse_line,
)
from nnwatch.store.finding import Finding
from nnwatch.store.paths import ensure_private_dir
from nnwatch.store.run_reader import read_events
from nnwatch.store.runlog import RunLogWriter
from nnwatch.testing.synthetic import make_meta

FINDING = Finding(
    "exploding_gradients", "error", 120, "the grad norm grew 40x in 10 steps.", "lower the LR.",
    layer="fc1", evidence={"grad_norm": 812.5, "ratio": float("inf"), "median": float("nan")},
    onset_step=110,
)  # fmt: skip

EVERY_KIND: list[Event] = [
    FindingEvent(finding=FINDING),
    SnapshotTaken(step=121, reason="auto: exploding_gradients", path="/runs/a/snapshots/step-121"),
    SnapshotFailed(step=122, error="No space left on device"),
    StepSkipped(step=123, reason="nonfinite"),
    CommandApplied(command="set_clip", args={"max_norm": 1.0}, step=124),
    TrainingError(step=125, error="RuntimeError('bad batch')"),
    RunEnded(step=126, status="crashed", reason="an exception", exception="RuntimeError",
             message="bad batch", exit_code=1),
    LogFailed(error="cannot append to the run log: the disk is full"),
]  # fmt: skip

#: what each producer wrote before events had types (the dicts of watched_run, the snapshot taker,
#: the guard, the command handler, watch's __exit__ and the run log's failure)
OLD_LINES = [
    {"type": "finding", **FINDING.to_dict()},
    {"type": "snapshot", "step": 121, "reason": "auto: exploding_gradients",
     "path": "/runs/a/snapshots/step-121"},
    {"type": "snapshot_failed", "step": 122, "error": "No space left on device"},
    {"type": "skipped_step", "step": 123, "reason": "nonfinite"},
    {"type": "command", "command": "set_clip", "args": {"max_norm": 1.0}, "step": 124},
    {"type": "error", "step": 125, "error": "RuntimeError('bad batch')"},
    {"type": "run_ended", "step": 126, "status": "crashed", "reason": "an exception",
     "exception": {"type": "RuntimeError", "message": "bad batch"}, "exit_code": 1},
    {"type": "log_failed", "error": "cannot append to the run log: the disk is full"},
]  # fmt: skip


def _written(tmp_path: Path, events: list[Event]) -> Path:
    """``events`` appended by the run log's own writer, as a trainer appends them."""
    writer = RunLogWriter(ensure_private_dir(tmp_path / "run"), make_meta("events", 2))
    for ev in events:
        writer.events.event(ev)
    writer.close()
    return tmp_path / "run" / "events.jsonl"


def test_each_kind_is_written_with_the_keys_and_values_it_always_had(tmp_path: Path) -> None:
    path = _written(tmp_path, EVERY_KIND)
    lines = [json.loads(raw) for raw in path.read_bytes().splitlines()]
    assert len(lines) == len(OLD_LINES)
    for line, old in zip(lines, OLD_LINES, strict=True):
        assert isinstance(line.pop("time"), float)  # the writer stamps each line
        assert line == json.loads(json.dumps(old))  # NaN evidence as null, inf as "inf"
    assert all(raw == json.dumps(json.loads(raw), sort_keys=True).encode()
               for raw in path.read_bytes().splitlines())  # fmt: skip


def test_a_written_event_reads_back_as_the_same_type_and_fields(tmp_path: Path) -> None:
    path = _written(tmp_path, EVERY_KIND)
    for read in (read_events(path), EventTail(path).read_events()):
        assert [type(e) for e in read] == [type(e) for e in EVERY_KIND]
        for got, made in zip(read, EVERY_KIND, strict=True):
            assert got.type == made.type and got.step == made.step
            assert got.time is not None and made.time is None
            assert {k: v for k, v in got.to_json().items() if k != "time"} == json.loads(
                json.dumps(made.to_json())
            )
    back = read_events(path)
    assert isinstance(back[0], FindingEvent)
    f = back[0].finding
    assert (f.kind, f.severity, f.step, f.layer, f.onset_step) == ("exploding_gradients", "error", 120, "fc1", 110)
    assert f.evidence["grad_norm"] == 812.5 and f.evidence["ratio"] == float("inf")
    assert isinstance(back[4], CommandApplied) and back[4].args == {"max_norm": 1.0}
    assert isinstance(back[6], RunEnded) and (back[6].exception, back[6].message) == ("RuntimeError", "bad batch")


def test_an_event_reads_like_the_dict_of_its_line(tmp_path: Path) -> None:
    """``load_run(...).events`` was a list of dicts: the reads users wrote still work."""
    [snap] = read_events(_written(tmp_path, [EVERY_KIND[1]]))
    assert snap["type"] == "snapshot" and snap.get("step") == 121 and snap.get("nope") is None
    assert "path" in snap and "kind" not in snap
    line = json.loads((tmp_path / "run" / "events.jsonl").read_bytes())
    assert snap == line and dict(snap) == line and snap.to_json() == line
    assert {**snap, "rank": 0} == {**line, "rank": 0}
    made = EVERY_KIND[0]
    assert made["kind"] == "exploding_gradients" and made.get("type") == "finding"


def test_lines_of_an_older_writer_are_typed_and_kept_as_written(tmp_path: Path) -> None:
    old = [
        # a finding from before events had a "type", worded by its message alone
        {"kind": "loss_spike", "severity": "warning", "step": 40, "layer": None,
         "evidence": {"loss": 6.5}, "remedy": "lower the LR", "message": "loss jumped 6.5x"},
        # a command line that named its command "name", with fields of its own
        {"type": "command", "name": "clip", "args": {"max_norm": 1.0}, "step": 80,
         "message": "clip 1.0 applied", "time": 12.5},
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in old))
    finding, command = read_events(path)
    assert isinstance(finding, FindingEvent) and finding.finding.summary == "loss jumped 6.5x"
    assert finding.get("type") is None and finding.to_json() == old[0]  # nothing added
    assert isinstance(command, CommandApplied)
    assert (command.command, command.step, command.time) == ("clip", 80, 12.5)
    assert command["name"] == "clip" and command.to_json() == old[1]
    # passed through a writer (a copy, the fixture), a line stays what it was
    copied = _written(tmp_path, [finding, command])
    again = [json.loads(raw) for raw in copied.read_bytes().splitlines()]
    assert again[0] == {**old[0], "time": again[0]["time"]} and again[1] == old[1]


def test_unknown_and_malformed_lines_are_kept_whole_never_raised(tmp_path: Path) -> None:
    odd = [
        {"type": "rank_joined", "step": 3, "rank": 7},  # a newer writer's type
        {"type": "finding", "kind": "dead_relu", "severity": "grave", "step": 4},  # no such severity
        {"type": "finding", "severity": "error", "step": 5},  # a finding without a kind
        {"type": "snapshot", "step": 6},  # no path
        {"type": "command", "command": "pause", "args": [1], "step": 7},  # arguments not an object
        {"type": "skipped_step", "step": "eight"},
        {"type": "run_ended", "step": 9},  # no status
        {"type": 10, "step": 1.5},
        {},
    ]
    garbage = [b"not json", b"[1, 2]", b'"text"', b"", b"[" * 100_000 + b"]" * 100_000, b'{"type": "snap']
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join([*(json.dumps(d).encode() for d in odd), *garbage]) + b"\n")
    warnings: list[str] = []
    got = read_events(path, warnings)
    assert [type(e) for e in got] == [OtherEvent] * len(odd)
    assert [e.to_json() for e in got] == odd and got == odd
    assert got[0].type == "rank_joined" and got[0].step == 3 and got[0]["rank"] == 7
    assert got[7].type == "" and got[7].step is None
    assert warnings == ["events.jsonl: skipped 6 unreadable line(s)"]  # the empty one too
    tail = EventTail(path)
    assert tail.read_events() == odd and tail.skipped == 5  # a tail passes over empty lines
    assert [parse_line(raw) for raw in garbage] == [None] * len(garbage)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)  # fmt: skip
event_like = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["finding", "snapshot", "snapshot_failed", "skipped_step", "command",
                                 "error", "run_ended", "log_failed", "other"]) | json_values,
        "kind": json_values, "severity": st.sampled_from(["info", "error", "bogus"]) | json_values,
        "step": json_values, "time": json_values, "path": json_values, "command": json_values,
        "name": json_values, "args": json_values, "status": json_values, "error": json_values,
        "evidence": json_values, "exception": json_values, "exit_code": json_values,
    },
)  # fmt: skip


@settings(max_examples=500, deadline=None, derandomize=True)
@given(event_like)
def test_any_json_object_parses_and_round_trips(data: dict[str, object]) -> None:
    ev = Event.from_json(data)
    assert ev.to_json() == data and ev == data
    assert isinstance(ev.type, str)
    assert ev.step is None or isinstance(ev.step, int)
    assert parse_line(json.dumps(data)) == clean_value(data)  # control characters shown, not obeyed
