"""The ring file: records round-trip, wrap-around and drops are counted, torn slots never leak."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from nnwatch.store.health import ring_health
from nnwatch.store.ring import RingWriter
from nnwatch.store.ring_layout import RingError
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.schema import RunMeta, RunSchema

REPO = Path(__file__).resolve().parents[2]


def _meta(layers: int = 4) -> RunMeta:
    names = tuple(f"l{i}" for i in range(layers))
    schema = RunSchema(names, ("Linear",) * layers, names, 1)
    return RunMeta("ring-test", schema, os.getpid(), "host", time.time())


def _writer(path: Path, meta: RunMeta, slots: int | None = None) -> RingWriter:
    return RingWriter(path, meta.schema.record_size, slots, meta_json=meta.to_json())


def _publish(w: RingWriter, meta: RunMeta, steps: range) -> None:
    rec = np.zeros(1, meta.schema.record_dtype())
    view = memoryview(rec.view(np.uint8))
    for s in steps:
        rec["step"] = s
        rec["loss"] = s * 0.5
        rec["act_sum"] = s
        w.publish(view)


def test_records_round_trip_with_the_run_schema(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta)
    r = RingReader(tmp_path / "ring")
    _publish(w, meta, range(10))
    recs = r.read()
    assert recs.dtype == meta.schema.record_dtype()
    assert recs["step"].tolist() == list(range(10))
    assert recs["loss"].tolist() == [s * 0.5 for s in range(10)]
    assert (recs["act_sum"][3] == 3).all()
    assert r.read().size == 0  # nothing new
    _publish(w, meta, range(10, 12))
    assert r.read()["step"].tolist() == [10, 11]
    assert (r.dropped, r.torn) == (0, 0)
    assert r.meta is not None and r.meta.schema == meta.schema
    state = r.state()
    assert state.pid == os.getpid() and state.write_seq == 12 and state.status == "running"
    w.close()
    assert r.state().status == "finished"
    r.close()


def test_ring_file_is_private(tmp_path: Path) -> None:
    w = _writer(tmp_path / "ring", _meta())
    assert stat.S_IMODE(os.stat(tmp_path / "ring").st_mode) == 0o600
    w.close()


def test_wrap_around_counts_exactly_what_a_slow_reader_lost(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta, slots=8)
    r = RingReader(tmp_path / "ring")
    _publish(w, meta, range(5))
    assert r.read()["step"].tolist() == [0, 1, 2, 3, 4]
    _publish(w, meta, range(5, 30))  # 25 new records into 8 slots: the reader loses 17
    recs = r.read()
    assert recs["step"].tolist() == list(range(22, 30))
    assert r.dropped == 17 and r.torn == 0
    assert r.delivered + r.dropped == 30
    w.close()


def test_max_records_reads_in_pieces_without_losing_any(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta, slots=64)
    r = RingReader(tmp_path / "ring")
    _publish(w, meta, range(50))
    got = []
    while True:
        part = r.read(max_records=7)
        if not len(part):
            break
        assert len(part) <= 7
        got += part["step"].tolist()
    assert got == list(range(50)) and r.dropped == 0
    w.close()


def test_late_reader_gets_what_the_ring_still_holds_or_only_new_records(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta, slots=16)
    _publish(w, meta, range(40))
    oldest = RingReader(tmp_path / "ring", start="oldest")
    latest = RingReader(tmp_path / "ring", start="latest")
    # the slot of the oldest record may be mid-overwrite at attach time, so it is skipped quietly
    assert oldest.read()["step"].tolist() in (list(range(24, 40)), list(range(25, 40)))
    assert oldest.dropped == 0
    assert latest.read().size == 0
    _publish(w, meta, range(40, 43))
    assert latest.read()["step"].tolist() == [40, 41, 42]
    assert oldest.read()["step"].tolist() == [40, 41, 42]
    from_seq = RingReader(tmp_path / "ring", start=30)
    assert from_seq.read()["step"].tolist() == list(range(30, 43))
    w.close()


def test_readers_are_independent(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta, slots=32)
    a, b = RingReader(tmp_path / "ring"), RingReader(tmp_path / "ring")
    _publish(w, meta, range(5))
    assert a.read()["step"].tolist() == [0, 1, 2, 3, 4]
    _publish(w, meta, range(5, 8))
    assert b.read()["step"].tolist() == list(range(8))
    assert a.read()["step"].tolist() == [5, 6, 7]
    a.close()  # detaching one reader changes nothing for the other or the writer
    _publish(w, meta, range(8, 9))
    assert b.read()["step"].tolist() == [8]
    w.close()


def test_flipped_payload_byte_is_torn_and_skipped(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta, slots=16)
    _publish(w, meta, range(6))
    r = RingReader(tmp_path / "ring")
    # corrupt record 3's payload in the file, as a write reordered by the CPU could leave it
    off = w.slots_offset + 3 * w.slot_size + 16 + 8  # inside the "time" field
    with open(tmp_path / "ring", "r+b") as fh:
        fh.seek(off)
        byte = fh.read(1)
        fh.seek(off)
        fh.write(bytes([byte[0] ^ 0xFF]))
    recs = r.read()
    assert recs["step"].tolist() == [0, 1, 2, 4, 5]
    assert r.torn == 1 and r.dropped == 0
    w.close()


def test_slot_caught_mid_write_is_torn_and_skipped(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta, slots=16)
    _publish(w, meta, range(4))
    r = RingReader(tmp_path / "ring")
    # record 2's slot still carries the odd "being written" sequence number 2n+1
    off = w.slots_offset + 2 * w.slot_size
    with open(tmp_path / "ring", "r+b") as fh:
        fh.seek(off)
        fh.write(struct.pack("<Q", 2 * 2 + 1))
    recs = r.read()
    assert recs["step"].tolist() == [0, 1, 3]
    assert r.torn == 1
    w.close()


def test_publish_never_raises_into_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta)
    w.publish(memoryview(b"too short"))
    w.publish(memoryview(b"still too short"))
    assert w.errors == 2
    assert sum("ring" in m for m in caplog.messages) == 1  # reported once
    good = np.zeros(1, meta.schema.record_dtype())
    w.publish(memoryview(good.view(np.float32)))  # another buffer format: slower path, accepted
    r = RingReader(tmp_path / "ring")
    assert len(r.read()) == 1
    w.close()
    w.publish(memoryview(good.view(np.uint8)))  # after close: ignored, no exception
    w.beat()


def test_not_a_ring_is_refused_in_words(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"x" * 5000)
    with pytest.raises(RingError, match="not an nnwatch ring"):
        RingReader(tmp_path / "junk")
    with pytest.raises(RingError, match="does not exist"):
        RingReader(tmp_path / "missing")


def test_heartbeat_and_status_are_visible_to_readers(tmp_path: Path) -> None:
    w = _writer(tmp_path / "ring", _meta())
    r = RingReader(tmp_path / "ring")
    before = r.state().heartbeat
    time.sleep(0.01)
    w.beat()
    assert r.state().heartbeat > before
    w.set_status("paused")
    assert r.state().status == "paused"
    with pytest.raises(ValueError):
        w.set_status("exploded")
    w.close("crashed")
    assert r.state().status == "crashed"


_STRESS_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from nnwatch.store.ring import RingWriter
    path, n = sys.argv[1], int(sys.argv[2])
    w = RingWriter(path, 4096, slots=4)
    rec = np.zeros(512, np.int64)
    view = memoryview(rec.view(np.uint8))
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    for i in range(n):
        rec[:] = i  # every word of record i holds i: a torn copy would mix two values
        w.publish(view)
    w.close()
    """
)


def test_concurrent_writer_never_yields_a_mixed_record(tmp_path: Path) -> None:
    """A writer process laps a 4-slot ring while this process reads: every record delivered is
    whole, and delivered + dropped + torn accounts for every record published."""
    n = 30000
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", _STRESS_WRITER, str(tmp_path / "ring"), str(n)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    r = RingReader(tmp_path / "ring")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    seen: list[int] = []
    last_ws = 0
    while True:
        # header words are single stores: never seen going back or zeroed mid-update
        state = r.state()
        assert state.write_seq >= last_ws and state.heartbeat > 0
        last_ws = state.write_seq
        batch = r.read_batch()
        for rec, seq in zip(batch.records, batch.seqs, strict=True):
            words = np.frombuffer(rec.tobytes(), np.int64)
            assert (words == seq).all(), f"record {seq} mixes values {set(words.tolist())}"
            seen.append(int(seq))
        if r.state().status == "finished" and r.pending == 0:
            break
    assert proc.wait(timeout=30) == 0
    assert seen == sorted(set(seen))
    assert len(seen) + r.dropped + r.torn == n
    assert seen[-1] == n - 1


def test_reader_reports_health_of_its_writer(tmp_path: Path) -> None:
    meta = _meta()
    w = _writer(tmp_path / "ring", meta)
    r = RingReader(tmp_path / "ring")
    assert ring_health(r).state == "starting" and r.last_step_age is None
    _publish(w, meta, range(3))
    assert ring_health(r).state == "running" and r.heartbeat_age < 5
    assert (r.pid, r.start_time) == (os.getpid(), w.start_time)
    w.close()
    assert ring_health(r).state == "finished"
