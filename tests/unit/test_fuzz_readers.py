"""Property tests over every reader of what nnwatch puts on disk or on the wire: whatever the
bytes, a reader returns a value, skips the entry, or raises its own error with a message; it
never raises anything else, hangs, or crashes the process.

Each reader gets a few hundred to a thousand cases: damaged copies of a valid file (bytes
flipped, cut short, spliced) and JSON of every shape.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnwatch.channel.commands import CommandError, parse_request
from nnwatch.diagnosis.snapshot import SnapshotError, read_manifest, read_record
from nnwatch.store.event_tail import EventTail
from nnwatch.store.health import clean_end, read_end
from nnwatch.store.registry_entry import EntryError, validate_entry
from nnwatch.store.ring import RingWriter
from nnwatch.store.ring_layout import RingError
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.run_reader import iter_events, load_run
from nnwatch.store.runlog import RunLogError, RunLogWriter
from nnwatch.store.schema import RunMeta
from nnwatch.testing.synthetic import make_meta

FAST = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)

META = make_meta("fuzz", 3)
GOOD_META = json.loads(META.to_json())
GOOD_ENTRY = {
    "pid": 1234, "name": "fuzz", "host": "h", "run_dir": "/nonexistent/run", "ring": "/nonexistent/run/ring",
    "socket": None, "start_time": 1.0, "started": 2.0, "rank": 0, "world_size": 1, "cmdline": ["x"],
}  # fmt: skip


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    buf = bytearray(data)
    for pos, value in edits:
        if buf:
            buf[pos % len(buf)] = value
    if cut is not None and buf:
        del buf[cut % len(buf) :]
    return bytes(buf)


edits_st = st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 255)), max_size=8)
cut_st = st.none() | st.integers(0, 2**31)


def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="nnw-fuzz-"))


# -- JSON side files ----------------------------------------------------------------------------


@FAST
@given(st.dictionaries(st.sampled_from(sorted(GOOD_META)), json_values, max_size=4))
def test_meta_json_fields_of_any_type(overrides: dict) -> None:
    text = json.dumps({**GOOD_META, **overrides})
    try:
        meta = RunMeta.from_json(text)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(meta.name, str) and isinstance(meta.pid, int)
    meta.schema.record_dtype()  # a schema that passed builds its dtype


@FAST
@given(json_values)
def test_meta_json_of_any_shape(value: object) -> None:
    try:
        RunMeta.from_json(json.dumps(value))
    except ValueError as exc:
        assert str(exc)


@FAST
@given(json_values)
def test_end_json_of_any_shape(value: object) -> None:
    end = clean_end(value)
    assert end is None or end["status"] in ("finished", "crashed", "interrupted", "stopped")
    if end is not None and "steps" in end:
        assert isinstance(end["steps"], int)


@FAST
@given(st.dictionaries(st.sampled_from(sorted(GOOD_ENTRY) + ["instance", "local_rank"]), json_values, max_size=4))
def test_registry_entry_fields_of_any_type(overrides: dict) -> None:
    try:
        entry = validate_entry({**GOOD_ENTRY, **overrides})
    except EntryError as exc:
        assert str(exc)
        return
    assert isinstance(entry["pid"], int) and entry["pid"] > 0


@FAST
@given(json_values)
def test_snapshot_manifest_and_record_of_any_shape(value: object) -> None:
    d = _tmp()
    try:
        (d / "manifest.json").write_text(json.dumps(value))
        (d / "record.json").write_text(json.dumps(value))
        try:
            m = read_manifest(d / "manifest.json")
            assert isinstance(m["step"], int)
        except SnapshotError as exc:
            assert str(exc)
        rec = read_record(d / "record.json")
        assert rec is None or isinstance(rec["loss_bits"], str)
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


@FAST
@given(st.binary(max_size=300), edits_st, cut_st)
def test_side_files_with_arbitrary_bytes(raw: bytes, edits: list, cut: int | None) -> None:
    d = _tmp()
    try:
        good = json.dumps({"step": 3, "version": 1, "status": "finished"}).encode()
        for name, data in (("end.json", raw), ("manifest.json", mutate(good, edits, cut))):
            (d / name).write_bytes(data)
        read_end(d)
        try:
            read_manifest(d / "manifest.json")
        except SnapshotError:
            pass
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


# -- events -------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.binary(max_size=80) | json_values.map(lambda v: json.dumps(v).encode()), max_size=12))
def test_events_lines_of_anything(lines: list[bytes]) -> None:
    d = _tmp()
    try:
        path = d / "events.jsonl"
        path.write_bytes(b"\n".join(lines))
        warnings: list[str] = []
        events = list(iter_events(path, warnings))
        assert all(isinstance(e, dict) for e in events)
        tail = EventTail(path)
        assert all(isinstance(e, dict) for e in tail.read())
    finally:
        path.unlink()
        d.rmdir()


# -- command lines ------------------------------------------------------------------------------


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(
    st.binary(max_size=200)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.fixed_dictionaries(
        {"cmd": st.sampled_from(["hello", "pause", "set_clip", "snapshot", "subscribe", "anomaly"])},
        optional={"args": json_values, "id": json_values},
    ).map(lambda v: json.dumps(v).encode())
)
def test_command_lines_of_anything(line: bytes) -> None:
    try:
        cmd = parse_request(line)
    except CommandError as exc:
        assert exc.message
        return
    assert isinstance(cmd.name, str) and isinstance(cmd.args, dict)


# -- binary files: the ring and the run log -----------------------------------------------------

_RING_DIR = _tmp()
_RING = _RING_DIR / "ring"
_w = RingWriter(_RING, META.schema.record_size, slots=4, meta_json=META.to_json())
_rows = np.zeros(6, dtype=META.schema.record_dtype())
_rows["step"] = np.arange(6)
for _r in _rows:
    _w.publish(memoryview(_r.tobytes()))
_w.close("crashed")
RING_BYTES = _RING.read_bytes()
os.unlink(_RING)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 600), st.integers(0, 255)), max_size=6),  # the header
    edits_st,  # anywhere
    cut_st,
)
def test_ring_header_and_slots_damaged(head: list, edits: list, cut: int | None) -> None:
    d = _tmp()
    path = d / "ring"
    try:
        data = bytearray(mutate(RING_BYTES, edits, cut))
        for pos, value in head:
            if pos < len(data):
                data[pos] = value
        path.write_bytes(bytes(data))
        try:
            with RingReader(path) as reader:
                state = reader.state()
                assert 0 <= state.write_seq
                batch = reader.read_batch()
                assert len(batch.records) <= reader.slots
                reader.latest()
        except RingError as exc:
            assert str(exc)
    finally:
        path.unlink()
        d.rmdir()


_LOG_DIR = _tmp() / "run"
_LOG_DIR.mkdir(mode=0o700)
_META_CRASHED = make_meta("fuzzlog", 3)
_META_CRASHED.pid = 999_999
_lw = RunLogWriter(_LOG_DIR, _META_CRASHED)
for _r in _rows:
    _lw.put(_r.tobytes())
_lw.close("finished", 6)
LOG_FILES = {p.name: p.read_bytes() for p in _LOG_DIR.iterdir()}


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    st.sampled_from(sorted(LOG_FILES)), edits_st, cut_st,
)  # fmt: skip
def test_run_log_files_damaged(name: str, edits: list, cut: int | None) -> None:
    d = _tmp() / "run"
    d.mkdir(mode=0o700)
    try:
        for n, data in LOG_FILES.items():
            (d / n).write_bytes(mutate(data, edits, cut) if n == name else data)
        try:
            run = load_run(d)
        except RunLogError as exc:
            assert str(exc)
            return
        assert len(run) <= 6
        assert all(isinstance(w, str) for w in run.warnings)
        assert run.status in ("finished", "crashed", "interrupted", "stopped", "running")
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
        d.parent.rmdir()


# -- issue 33: checksums, snapshot manifests, end.json against the log ---------------------------

_CRC_DIR = _tmp() / "run"
_CRC_DIR.mkdir(mode=0o700)
_crc_w = RunLogWriter(_CRC_DIR, _META_CRASHED)
for _i, _r in enumerate(_rows):
    _crc_w.put(_r.tobytes())
    if _i % 2:
        _crc_w._drain()  # three blocks of two rows, three checksum entries
_crc_w.close("finished", 6)
CRC_FILES = {p.name: p.read_bytes() for p in _CRC_DIR.iterdir()}
_SCALAR_SIZE = _META_CRASHED.schema.scalar_size


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(64, 64 + 6 * _SCALAR_SIZE - 1), st.integers(0, 255)), max_size=3),
    edits_st, cut_st, st.booleans(),
)  # fmt: skip
def test_crc_file_damaged_never_lets_a_changed_row_load_silently(
    rows_edits: list, crc_edits: list, cut: int | None, empty: bool
) -> None:
    """Whatever happens to scalars.crc (emptied, cut, bytes changed) and to the rows, a row that
    loads with other bytes than were written comes with a warning that it was not verified."""
    d = _tmp() / "run"
    d.mkdir(mode=0o700)
    try:
        for n, data in CRC_FILES.items():
            (d / n).write_bytes(data)
        scalars = bytearray(CRC_FILES["scalars.bin"])
        for pos, value in rows_edits:
            scalars[pos] = value
        (d / "scalars.bin").write_bytes(bytes(scalars))
        crc = b"" if empty else mutate(CRC_FILES["scalars.crc"], crc_edits, cut)
        (d / "scalars.crc").write_bytes(crc)
        run = load_run(d)
        original = {
            bytes(CRC_FILES["scalars.bin"][64 + i * _SCALAR_SIZE : 64 + (i + 1) * _SCALAR_SIZE])
            for i in range(6)
        }
        changed = [r for r in run.scalars if r.tobytes() not in original]
        if changed:
            said = " ".join(run.warnings)
            assert "not verified" in said or "inconsistent" in said, run.warnings
        if crc != CRC_FILES["scalars.crc"] and len(run.scalars) and crc[:16] != CRC_FILES["scalars.crc"][:16]:
            assert run.warnings  # a .crc that lost its first entry is never silent
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
        d.parent.rmdir()


_SNAP_FILES = {"state.pt": b"weights" * 40, "batch.pt": b"batch" * 30, "metrics.npy": b"m" * 10}


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    st.sampled_from(sorted(_SNAP_FILES)), edits_st, cut_st,
    st.dictionaries(st.sampled_from([*sorted(_SNAP_FILES), "../x", "", "a/b"]), json_values, max_size=2),
)  # fmt: skip
def test_snapshot_manifest_sha256_is_checked_before_any_use(
    name: str, edits: list, cut: int | None, files_override: dict
) -> None:
    """load_snapshot either refuses with a message, or every file the manifest lists (and that
    exists) has exactly the sha256 the manifest gives it."""
    from nnwatch.diagnosis.snapshot_files import ReplayError, load_snapshot

    d = _tmp()
    try:
        files = {n: _sha(b) for n, b in _SNAP_FILES.items()}
        for n, data in _SNAP_FILES.items():
            (d / n).write_bytes(mutate(data, edits, cut) if n == name else data)
        manifest = {"version": 1, "step": 3, "files": {**files, **files_override}}
        (d / "manifest.json").write_text(json.dumps(manifest))
        try:
            snap = load_snapshot(d)
        except ReplayError as exc:
            assert str(exc)
            return
        for n, digest in snap.manifest["files"].items():
            if (d / n).exists():
                assert _sha((d / n).read_bytes()) == digest
    finally:
        shutil.rmtree(d)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    st.integers(0, 6),  # rows left in the log
    st.dictionaries(
        st.sampled_from(["status", "steps", "lost_records", "log_error", "ended"]), json_values, max_size=4
    ),
    st.integers(0, 20),  # end.json's own step count
)  # fmt: skip
def test_end_json_against_the_log(keep: int, end_fields: dict, steps: int) -> None:
    """The audit check runs compares end.json with the log: it never fails, and a log shorter
    than the steps end.json names is always reported, with the exact count missing."""
    from nnwatch.store.completeness import audit

    d = _tmp() / "run"
    d.mkdir(mode=0o700)
    try:
        for n, data in LOG_FILES.items():
            (d / n).write_bytes(data)
        with open(d / "scalars.bin", "r+b") as fh:
            fh.truncate(64 + keep * _META_CRASHED.schema.scalar_size)
        end = {"status": "finished", "steps": steps, **end_fields}
        (d / "end.json").write_text(json.dumps(end))
        run = load_run(d)
        result = audit(run)
        assert all(isinstance(p, str) for p in result.problems + result.notes)
        expected = run.end.get("steps")
        if isinstance(expected, int) and not isinstance(expected, bool):
            present = {int(s) for s in run.scalars["step"]}
            # counted, not enumerated: end.json may name a hundred million steps
            missing = max(expected, 0) - sum(1 for s in present if 0 <= s < expected)
            assert result.missing_steps == missing
            if missing:
                assert any("missing" in p for p in result.problems)
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
        d.parent.rmdir()
