"""The run log survives kill -9, and damaged files get clear errors instead of garbage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.store.runlog import RunLogError
from tests.conftest import REPO


def _finished_run(steps: int = 5) -> Path:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with nnwatch.watch(model, name="log", layer_interval=2) as w:
        for _ in range(steps):
            model.zero_grad()
            loss = model(torch.randn(2, 3)).sum()
            loss.backward()
            w.step(loss)
    return w.run_dir


def test_kill_9_mid_run_loses_at_most_the_last_record(subprocess_env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "100000", "--name", "killed"],
        cwd=REPO,
        env=subprocess_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    run_dir = None
    last = -1
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("run_dir "):
            run_dir = Path(line.split(" ", 1)[1].strip())
        elif line.startswith("step "):
            last = int(line.split()[1])
            if last >= 300:
                break
    os.kill(proc.pid, signal.SIGKILL)
    # the trainer printed up to `last` before dying; it may have done one more step unseen
    for line in proc.stdout:
        if line.startswith("step "):
            last = int(line.split()[1])
    proc.wait(timeout=10)
    assert run_dir is not None and last >= 300
    run = nnwatch.load_run(run_dir)
    assert run.status == "crashed"
    assert not (run_dir / "end.json").exists()
    assert len(run) >= last  # at most the last record lost
    assert list(run.steps[:5]) == [0, 1, 2, 3, 4]
    assert np.all(np.diff(run.steps) == 1)
    assert np.all(np.isfinite(run["loss"]))


def test_partial_last_row_is_ignored_with_a_warning() -> None:
    run_dir = _finished_run(5)
    with open(run_dir / "scalars.bin", "ab") as fh:
        fh.write(b"\x01\x02\x03")  # what a kill during a write leaves behind
    run = nnwatch.load_run(run_dir)
    assert len(run) == 5
    assert any("partial last row" in w for w in run.warnings)


def test_corrupt_files_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(RunLogError, match="not a directory"):
        nnwatch.load_run(tmp_path / "nope")
    with pytest.raises(RunLogError, match="no meta.json"):
        nnwatch.load_run(tmp_path)
    run_dir = _finished_run(3)
    scalars = run_dir / "scalars.bin"
    good = scalars.read_bytes()
    scalars.write_bytes(b"garbage!" + good[8:])
    with pytest.raises(RunLogError, match="not an nnwatch log"):
        nnwatch.load_run(run_dir)
    scalars.write_bytes(good)
    meta = run_dir / "meta.json"
    text = meta.read_text()
    meta.write_text(text[: len(text) // 2])
    with pytest.raises(RunLogError, match="meta.json is corrupt"):
        nnwatch.load_run(run_dir)
    d = json.loads(text)
    d["schema"]["layer_names"].append("extra")
    d["schema"]["layer_kinds"].append("ReLU")
    meta.write_text(json.dumps(d))
    with pytest.raises(RunLogError, match="mixes files from different runs"):
        nnwatch.load_run(run_dir)


def test_corrupt_event_lines_are_skipped_and_counted() -> None:
    run_dir = _finished_run(2)
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write('{"type": "finding", "kind": "dead_relu", "step": 1}\n')
        fh.write("{not json\n")
        fh.write("[1, 2]\n")
    run = nnwatch.load_run(run_dir)
    assert [e["kind"] for e in run.findings] == ["dead_relu"]
    assert any("skipped 2 unreadable line" in w for w in run.warnings)


def test_log_is_readable_while_being_written() -> None:
    model = nn.Linear(3, 1)
    w = nnwatch.watch(model, name="growing")
    seen = []
    for _ in range(40):
        model.zero_grad()
        loss = model(torch.randn(2, 3)).sum()
        loss.backward()
        w.step(loss)
        time.sleep(0.01)
        run = nnwatch.load_run(w.run_dir)
        assert run.status == "running"
        seen.append(len(run))
    # the writer drains every 0.25 s, which a loaded machine may stretch: wait for it, still live
    deadline = time.monotonic() + 30
    while seen[-1] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        run = nnwatch.load_run(w.run_dir)
        assert run.status == "running"
        seen.append(len(run))
    w.close()
    final = nnwatch.load_run(w.run_dir)
    assert final.status == "finished" and len(final) == 40
    assert seen == sorted(seen)  # never shrinks, never a torn row
    assert 0 < seen[-1] <= 40  # read while the run was writing it (status "running" above)


def test_full_disk_is_reported_and_training_goes_on(subprocess_env: dict[str, str]) -> None:
    # RLIMIT_FSIZE makes write() fail with EFBIG once the file would pass the limit, just as a
    # full disk fails with ENOSPC: the trainer must log it once and finish its loop.
    code = (
        "import resource, signal, torch, nnwatch\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "with nnwatch.watch(m, name='full') as w:\n"
        "    for i in range(400):\n"
        "        m.zero_grad(); l = m(torch.randn(2, 4)).sum(); l.backward(); w.step(l)\n"
        "print('trained', w.step_index, len(w.findings), flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "trained 400" in out.stdout
    assert "cannot append to the run log" in out.stderr
    assert out.stderr.count("cannot append to the run log") == 1


def test_a_fast_loop_wakes_the_writer_before_its_interval(tmp_path: Path) -> None:
    """The log may lag the ring by less than the ring holds: ``wake_at`` records drain at once."""
    from nnwatch.store.runlog import RunLogWriter
    from nnwatch.testing.synthetic import make_meta

    meta = make_meta("fast", 2)
    writer = RunLogWriter(tmp_path, meta, interval=60.0)  # the timer alone would wait a minute
    writer.wake_at = 8
    record = bytes(meta.schema.record_size)
    for _ in range(7):
        writer.put(record)
    time.sleep(0.3)
    assert writer.written == 0  # below the mark: the records wait for the interval
    writer.put(record)
    deadline = time.monotonic() + 10
    while writer.written < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.written == 8
    writer.close()
    assert len(nnwatch.load_run(tmp_path)) == 8
