"""A disk that fills up during a run (a real 4 MiB tmpfs): the detectors keep their records, the
failure is written down with its cause, a clean end still reads "finished", nothing half-made is
left behind, and a snapshot that cannot be written says the disk is full."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from nnwatch.store.run_reader import iter_events, load_run
from nnwatch.store.runlog import END_FILE, RunLogWriter
from nnwatch.testing.synthetic import make_meta
from tests.small_disk import fill


def test_a_full_disk_keeps_the_detectors_fed_and_the_end_clean(tmpfs: Path) -> None:
    run_dir = tmpfs / "run"
    run_dir.mkdir(mode=0o700)
    meta = make_meta("full", 4)
    meta.pid = 999_999
    writer = RunLogWriter(run_dir, meta, interval=0.05)
    seen: list[int] = []
    writer.observers.append(lambda rows: seen.extend(rows["step"].astype(int).tolist()))
    errors: list[str] = []
    writer.on_error.append(errors.append)

    def put(steps: range) -> None:
        rows = np.zeros(len(steps), dtype=meta.schema.record_dtype())
        rows["step"] = np.arange(steps.start, steps.stop)
        for r in rows:
            writer.put(r.tobytes())
        writer._wake.set()

    put(range(50))
    writer._drain()
    fill(tmpfs / "filler")
    put(range(50, 3000))
    writer.close("finished", 3000)
    assert seen == list(range(3000))  # every record reached the detectors
    assert errors and "disk is full" in errors[0]
    assert writer.error and "disk is full" in writer.error
    end = load_run(run_dir)
    assert end.status == "finished" and end.end["status"] == "finished"
    assert "disk is full" in end.end["log_error"]
    assert end.end["lost_records"] > 0
    leftovers = [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp") or "reserve" in p.name]
    assert leftovers == []
    (run_dir.parent / "filler").unlink()
    events = list(iter_events(run_dir / "events.jsonl"))
    assert events == [] or events[-1]["type"] == "log_failed"
    assert (run_dir / END_FILE).exists()


def test_a_snapshot_on_a_full_disk_says_so_and_files_are_private(tmpfs: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    import nnwatch
    from nnwatch.diagnosis.snapshot import SnapshotError, preflight, write_snapshot
    from nnwatch.probe.watch import internals

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = torch.optim.Adam(model.parameters())
    w = nnwatch.watch(model, opt, run_dir=tmpfs / "run", channel=False, detectors=False)
    try:
        x, y = torch.randn(8, 64), torch.randint(0, 4, (8,))
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        path = write_snapshot(internals(w).parts.snapshots.owner, reason="test", state=state, rng={}, batch=(x, y))
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()}
        assert modes and set(modes.values()) == {0o600}, modes
        fill(tmpfs / "filler")
        assert "disk is full" in (preflight(internals(w).parts.snapshots.owner) or "")
        with pytest.raises(SnapshotError, match="disk is full"):
            write_snapshot(internals(w).parts.snapshots.owner, reason="test", state=state, rng={}, batch=(x, y))
        snaps = [p.name for p in (tmpfs / "run" / "snapshots").iterdir()]
        assert snaps == [path.name]  # the half-written one was removed
        assert any("disk is full" in str(getattr(f, "summary", f)) for f in w.findings)
    finally:
        (tmpfs / "filler").unlink(missing_ok=True)
        w.close()
