"""Smaller trust defects (issue 33, item 14), each with the real thing: a second uid that
pre-creates ``/dev/shm/nnwatch-$UID``, registry entries of every odd kind, a real full tmpfs, a
damaged log header, a symlink for a run directory, and the ``log_failed`` event in ``open``."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nnwatch.sources.recorded import RecordedSource
from nnwatch.store import registry
from nnwatch.store.run_reader import load_run
from nnwatch.store.runlog import RunLogError, RunLogWriter
from nnwatch.testing.synthetic import make_meta
from tests.conftest import PYTHON
from tests.integration.test_run_status import LOOP
from tests.small_disk import fill

OTHER = "nnw-b"


def _other_uid() -> int:
    """A second local user, made for the test when it is not there (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a second user")
    try:
        return pwd.getpwnam(OTHER).pw_uid
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("no useradd here")
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", OTHER], check=True)
        return pwd.getpwnam(OTHER).pw_uid


def test_another_users_dev_shm_dir_falls_back_to_tmp_with_a_message(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """In a private mount namespace with a fresh /dev/shm (this machine's stays untouched), the
    other user makes ``/dev/shm/nnwatch-$UID`` first; the trainer and ``ls`` both use the
    fallback under $TMPDIR, and say so."""
    _other_uid()
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("needs unshare and setpriv (util-linux)")
    shm = f"/dev/shm/nnwatch-{os.getuid()}"
    env = {k: v for k, v in subprocess_env.items() if k != "NNWATCH_RUN_DIR"}
    env["TMPDIR"] = str(tmp_path)  # the fallback, kept inside the test
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(LOOP) + "def FAILURE():\n    pass\n"
        "with nnwatch.watch(model, opt, name='p') as w:\n    train(w, 5)\n"
    )
    inside = (
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 77; "
        f"setpriv --reuid={OTHER} --regid={OTHER} --clear-groups mkdir -m 0755 {shm} || exit 78; "
        f"{PYTHON} {script} || exit 1; echo ---ls---; {PYTHON} -m nnwatch ls --all; "
        f"echo ---shm---; ls -A {shm}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inside],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    if done.returncode in (77, 78) or "unshare failed" in done.stderr:
        pytest.skip(f"cannot make a private /dev/shm here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    fallback = tmp_path / f"nnwatch-{os.getuid()}"
    assert f"{shm} belongs to uid" in done.stderr and str(fallback) in done.stderr, done.stderr
    assert "monitoring is off" not in done.stderr
    (run,) = fallback.glob("runs/p-*")
    assert len(load_run(run)) == 5
    listed, shm_files = done.stdout.split("---ls---", 1)[1].split("---shm---")
    assert run.name in listed, done.stdout
    assert shm_files.strip() == ""  # nothing was written into the other user's directory


def test_every_odd_registry_entry_gets_its_one_line(run_root: Path, tmp_path: Path) -> None:
    uid = _other_uid()
    reg = run_root / "registry"
    reg.mkdir(mode=0o700, parents=True)
    os.mkfifo(reg / "a-fifo.json")
    (reg / "b-dir.json").mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"pid": os.getpid(), "ring": "x", "run_dir": "y"}))
    (reg / "c-link.json").symlink_to(target)
    theirs = reg / "d-theirs.json"
    theirs.write_text(json.dumps({"pid": os.getpid(), "ring": "x", "run_dir": "y"}))
    os.chown(theirs, uid, uid)
    problems: list[str] = []
    assert registry.list_runs(problems=problems) == []
    said = dict(p.split(": ", 1) for p in problems)
    assert said == {
        "skipped the registry entry a-fifo.json": "it is a FIFO, not a file",
        "skipped the registry entry b-dir.json": "it is a directory, not a file",
        "skipped the registry entry c-link.json": "it is a symlink (not followed)",
        "skipped the registry entry d-theirs.json": f"it belongs to uid {uid}, not to you (uid {os.getuid()})",
    }
    ls = subprocess.run(
        [PYTHON, "-m", "nnwatch", "ls", "--root", str(run_root)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ls.returncode == 0 and ls.stderr.count("skipped the registry entry") == 4, ls.stderr


def test_a_full_disk_is_not_called_a_killed_run(tmpfs: Path) -> None:
    run_dir = tmpfs / "run"
    run_dir.mkdir(mode=0o700)
    meta = make_meta("full", 4)
    meta.pid = 999_999
    writer = RunLogWriter(run_dir, meta, interval=0.05)
    rows = np.zeros(20, dtype=meta.schema.record_dtype())
    rows["step"] = np.arange(20)
    for r in rows:
        writer.put(r.tobytes())
    writer._drain()
    fill(tmpfs / "filler")
    rows["step"] += 20
    for r in np.repeat(rows, 100):
        writer.put(r.tobytes())
    writer.close("finished", 2020)
    run = load_run(run_dir)
    partial = [w for w in run.warnings if "partial last row" in w]
    assert partial, run.warnings  # a write cut short by the full disk
    assert not any(w.endswith("the run was killed)") for w in run.warnings), run.warnings
    assert "disk that filled up" in partial[0]


def test_a_damaged_header_is_called_damaged_not_another_runs_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    meta = make_meta("hdr", 4)
    meta.pid = 999_999
    writer = RunLogWriter(run_dir, meta)
    rows = np.zeros(10, dtype=meta.schema.record_dtype())
    rows["step"] = np.arange(10)
    for r in rows:
        writer.put(r.tobytes())
    writer.close("finished", 10)
    with open(run_dir / "scalars.bin", "r+b") as fh:
        fh.seek(8)
        fh.write(b"\x37\x13")  # two bytes of the row size flipped
    with pytest.raises(RunLogError) as err:
        load_run(run_dir)
    assert "header is damaged" in str(err.value) and "different runs" not in str(err.value)


def test_a_symlink_to_a_file_for_run_dir_is_called_a_symlink(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import nnwatch

    (tmp_path / "a-file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a-file")
    w = nnwatch.watch(torch.nn.Linear(2, 1), None, run_dir=tmp_path / "link")
    try:
        assert w.disabled and "is a symlink" in w.disabled, w.disabled
        assert "exists and is not a directory" not in w.disabled
    finally:
        w.close()


def test_the_log_failed_row_in_open_shows_its_text(tmp_path: Path) -> None:
    from nnwatch.testing.tui import fixed_hardware
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.widgets.events import EventsPane

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    meta = make_meta("lf", 4)
    meta.pid = 999_999
    writer = RunLogWriter(run_dir, meta)
    rows = np.zeros(10, dtype=meta.schema.record_dtype())
    rows["step"] = np.arange(10)
    for r in rows:
        writer.put(r.tobytes())
    writer.close("finished", 10)
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"time": time.time(), "type": "log_failed", "step": 7,
                             "error": "cannot write scalars.bin: the disk is full"}) + "\n")  # fmt: skip
    app = NNWatchApp(RecordedSource(run_dir), hardware=fixed_hardware, fps=10)
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(50):
                await pilot.pause(0.1)
                text = app.query_one(EventsPane)._picture.plain
                if "LOG_F" in text or "ERROR" in text:
                    break
            seen["text"] = app.query_one(EventsPane)._picture.plain

    asyncio.run(main())
    assert "the disk is full" in seen["text"], seen["text"]
