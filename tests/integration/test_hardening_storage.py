"""Hardening of the files nnwatch writes and reads: a full tmpfs, planted symlinks and FIFOs,
another user's directories, and damaged files never crash a reader or redirect a write.

Root-only parts (a real tmpfs of a few MB, a second uid in a forked child) are skipped with a
reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from nnwatch.store import registry
from nnwatch.store.paths import RunDirError, make_run_dir, write_private_file
from nnwatch.store.ring import RingWriter
from nnwatch.store.ring_layout import RingError
from nnwatch.store.ring_reader import RingReader
from nnwatch.store.run_reader import fold_ring_into_log, load_run
from nnwatch.store.runlog import END_FILE, MAGIC_V1, SCALARS_FILE, RunLogWriter, crc_path
from nnwatch.store.schema import RunMeta
from nnwatch.testing.synthetic import make_meta
from tests.small_disk import ROOT, fill

needs_root = pytest.mark.skipif(not ROOT, reason="needs root: mounts a tmpfs / switches uid")
PYTHON = sys.executable
REPO = Path(__file__).resolve().parents[2]


def records(meta: RunMeta, steps: range) -> np.ndarray:
    rows = np.zeros(len(steps), dtype=meta.schema.record_dtype())
    rows["step"] = np.arange(steps.start, steps.stop, dtype=np.float64)
    rows["loss"] = 1.0 + rows["step"].astype(np.float32) / 100
    rows["layer_stats"] = 1.0
    return rows


def write_log(run_dir: Path, meta: RunMeta, steps: range, *, close: bool = True) -> RunLogWriter:
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    w = RunLogWriter(run_dir, meta)
    for r in records(meta, steps):
        w.put(r.tobytes())
    if close:
        w.close("finished", steps.stop)
    return w


def cli(*args: str, root: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NNWATCH_RUN_DIR": str(root), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [PYTHON, "-m", "nnwatch", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


# -- 2: a full tmpfs never leaves a file that kills readers with SIGBUS --------------------------


def test_a_ring_that_does_not_fit_is_refused_and_removed(tmpfs: Path) -> None:
    path = tmpfs / "ring"
    with pytest.raises(RingError, match="disk is full"):
        RingWriter(path, 1024, slots=8192)  # 8 MiB on a 4 MiB tmpfs
    assert not path.exists()  # no all-holes file is left for readers to touch


def test_readers_survive_a_sparse_ring_on_a_full_tmpfs(tmpfs: Path) -> None:
    """What an older nnwatch left behind: a zero-filled sparse ring, then the tmpfs filled up.
    Reading its header (and a sparse one with a valid magic) killed ls, load_run and open."""
    root = tmpfs / "root"
    run_dir = root / "runs" / "r1"
    meta = make_meta("sparse", 2)
    meta.pid = 999_999  # gone
    write_log(run_dir, meta, range(5))
    (run_dir / END_FILE).unlink()  # crashed
    zero = run_dir / "ring"
    with open(zero, "wb") as fh:
        fh.truncate(8 << 20)  # holes only, as posix_fallocate failing left it
    magic = run_dir / "ring-r1"
    with open(magic, "wb") as fh:  # a ring header with holes behind it
        fh.truncate(8 << 20)
        fh.write(b"NNWRING\x01")
    fill(tmpfs / "filler")
    code = (
        "import sys\n"
        "from nnwatch.store.ring_layout import RingError\n"
        "from nnwatch.store.ring_reader import RingReader\n"
        "from nnwatch.store.run_reader import load_run\n"
        "for p in sys.argv[1:3]:\n"
        "    try:\n"
        "        RingReader(p)\n"
        "    except RingError as e:\n"
        "        print('refused', e)\n"
        "run = load_run(sys.argv[3])\n"
        "print('loaded', len(run), run.status)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [PYTHON, "-c", code, str(zero), str(magic), str(run_dir)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # -7 would be SIGBUS
    assert out.stdout.count("refused") == 2
    assert "loaded 5 crashed" in out.stdout
    ls = cli("ls", "--all", "--json", root=root)
    assert ls.returncode == 0, ls.stderr
    assert [r["state"] for r in json.loads(ls.stdout)] == ["crashed"]


# -- 4: one bad registry entry never breaks ls or gc; a FIFO never hangs them --------------------


def test_bad_registry_entries_are_skipped_with_one_line_each(run_root: Path, tmp_path: Path) -> None:
    reg = run_root / "registry"
    reg.mkdir(mode=0o700, parents=True)
    good_dir = run_root / "runs" / "good"
    meta = make_meta("good", 2)
    write_log(good_dir, meta, range(3))
    good = {"pid": os.getpid(), "name": "good", "host": meta.host, "run_dir": str(good_dir),
            "ring": str(good_dir / "ring"), "start_time": 0.0, "started": time.time()}  # fmt: skip
    (reg / "a-good.json").write_text(json.dumps(good))
    fifo_dir = tmp_path / "fifo-run"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "ring")
    os.mkfifo(fifo_dir / "end.json")
    bad = {
        "b-list.json": "[1]",
        "c-pid.json": json.dumps({**good, "pid": "12"}),
        "d-rank.json": json.dumps({**good, "pid": 2, "rank": "zero"}),
        "e-types.json": json.dumps({**good, "pid": 3, "world_size": 0}),
        "f-json.json": "{not json",
        "g-fifo.json": json.dumps({**good, "pid": 4, "ring": str(fifo_dir / "ring"),
                                   "run_dir": str(fifo_dir)}),  # fmt: skip
    }
    for name, text in bad.items():
        (reg / name).write_text(text)
    os.mkfifo(reg / "h-fifo.json")
    problems: list[str] = []
    runs = registry.list_runs(problems=problems)
    assert {r.name for r in runs} == {"good"} | {"good"}  # the FIFO-ring entry is judged, not hung
    assert len([r for r in runs if r.pid == 4]) == 1
    assert len(problems) == 6 and all("skipped the registry entry" in p for p in problems)
    ls = cli("ls", "--all", root=run_root)
    assert ls.returncode == 0, ls.stderr
    assert "good" in ls.stdout
    assert ls.stderr.count("skipped the registry entry") == 6  # the FIFO entry too
    assert "Traceback" not in ls.stderr
    gc = cli("gc", root=run_root)
    assert gc.returncode == 0 and "Traceback" not in gc.stderr, gc.stderr
    assert (reg / "b-list.json").exists()  # what cannot be read is named, never removed


# -- 6: damaged files are one clear line, not a traceback ---------------------------------------


def test_damaged_end_json_and_flipped_log_bytes_are_reported(tmp_path: Path) -> None:
    meta = make_meta("damaged", 2)
    run_dir = tmp_path / "run"
    write_log(run_dir, meta, range(100))
    (run_dir / END_FILE).write_text("[1]")
    run = load_run(run_dir)
    assert len(run) == 100 and run.status == "finished"
    assert any("end.json is corrupt" in w for w in run.warnings)
    path = run_dir / SCALARS_FILE
    data = bytearray(path.read_bytes())
    data[64 + 10 * meta.schema.scalar_size + 40] ^= 0x10  # one bit in the row of step 10
    path.write_bytes(bytes(data))
    run = load_run(run_dir)
    assert 10 not in set(run["step"].astype(int)) and len(run) < 100
    assert any("failed their checksum" in w and "steps" in w for w in run.warnings)


def test_format_1_logs_without_checksums_still_load(tmp_path: Path) -> None:
    meta = make_meta("old", 2)
    run_dir = tmp_path / "run"
    write_log(run_dir, meta, range(20))
    for name in ("scalars.bin", "layers.bin"):
        p = run_dir / name
        data = bytearray(p.read_bytes())
        data[:8] = MAGIC_V1
        p.write_bytes(bytes(data))
        crc_path(p).unlink()
    run = load_run(run_dir)
    assert len(run) == 20 and not [w for w in run.warnings if "checksum" in w]


def test_a_corrupt_ring_header_and_torn_records_are_named(tmp_path: Path) -> None:
    meta = make_meta("ringy", 2)
    meta.pid = 999_999  # its trainer is gone
    run_dir = tmp_path / "run"
    write_log(run_dir, meta, range(10))
    (run_dir / END_FILE).unlink()
    w = RingWriter(run_dir / "ring", meta.schema.record_size, slots=64, meta_json=meta.to_json())
    for r in records(meta, range(25)):
        w.publish(memoryview(r.tobytes()))
    w.close("crashed")
    path = run_dir / "ring"
    with RingReader(path) as reader:
        slot_size = reader.slot_size
    with open(path, "r+b") as fh:  # damage the payload of 15 records (steps 10..24)
        slots_off = int.from_bytes(fh.read(16)[12:16], "little")  # header: magic, version, offset
        for n in range(10, 25):
            fh.seek(slots_off + n * slot_size + 16 + 8)
            fh.write(b"\xff\xff\xff\xff")
    run = load_run(run_dir)
    assert len(run) == 10
    assert any("15 record(s) in the ring file failed their checksum" in x for x in run.warnings)
    with open(path, "r+b") as fh:  # a write position of 2**63-1
        fh.seek(64)
        fh.write((2**63 - 1).to_bytes(8, "little"))
    with pytest.raises(RingError, match="corrupt header"):
        RingReader(path)
    info = registry.inspect_dir(run_dir)
    assert info is not None and info.step == 9 and info.state == "crashed"


# -- 1: no symlink followed, no directory of another user written into --------------------------


def test_planted_symlinks_in_an_own_run_dir_are_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    os.symlink(victim, run_dir / "scalars.bin")
    with pytest.raises(OSError):
        RunLogWriter(run_dir, make_meta("x", 1))
    assert victim.read_bytes() == b"precious"
    # a planted temporary file (any name an attacker can guess) is never the one written
    for name in (f".meta.json.{os.getpid()}.tmp", ".end.json.reserve"):
        os.symlink(victim, run_dir / name)
    write_private_file(run_dir / "meta.json", b"{}")
    assert victim.read_bytes() == b"precious"
    assert stat.S_IMODE(os.lstat(run_dir / "meta.json").st_mode) == 0o600
    os.symlink(run_dir, tmp_path / "link")
    with pytest.raises(RunDirError, match="symlink"):
        make_run_dir(tmp_path / "link")


@needs_root
def test_a_run_dir_pre_created_by_another_user_is_refused(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    shared = Path(tempfile.mkdtemp(prefix="nnw-shared-"))  # under /tmp: others can traverse
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    os.chmod(shared, 0o1777)  # like /tmp
    victim = tmp_path / "root-owned"
    victim.write_bytes(b"root data")
    events_victim = tmp_path / "root-events"
    events_victim.write_bytes(b"root events")
    planted = shared / "run"
    pid = os.fork()
    if pid == 0:  # the other user
        try:
            os.setgid(65534)
            os.setuid(65534)
            planted.mkdir(mode=0o777)
            os.chmod(planted, 0o777)
            os.symlink(victim, planted / "scalars.bin")
            os.symlink(events_victim, planted / "events.jsonl")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with pytest.raises(RunDirError, match="belongs to uid 65534"):
        make_run_dir(planted)
    # a trainer given that directory keeps training, unwatched, and writes nothing there
    import torch

    import nnwatch

    model = torch.nn.Linear(3, 1)
    with nnwatch.watch(model, None, name="victim", run_dir=planted) as w:
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            w.step()
    assert w.disabled and "65534" in w.disabled
    assert victim.read_bytes() == b"root data" and events_victim.read_bytes() == b"root events"
    fresh = make_run_dir(shared / "mine" / "run")  # a new one is made private
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700


# -- 7: a crashed run's ring is folded into its log by gc; its state survives ------------------


def _crash_child(run_dir: Path, logged: int, ringed: int) -> int:
    """A trainer that logs ``logged`` steps, publishes ``ringed`` to its ring, and is killed."""
    pid = os.fork()
    if pid == 0:
        try:
            meta = make_meta("crashy", 2)
            w = RunLogWriter(run_dir, meta)
            ring = RingWriter(run_dir / "ring", meta.schema.record_size, slots=256,
                              meta_json=meta.to_json())  # fmt: skip
            for i, r in enumerate(records(meta, range(ringed))):
                ring.publish(memoryview(r.tobytes()))
                if i < logged:
                    w.put(r.tobytes())
            w._drain()
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    return pid


def test_gc_folds_a_crashed_runs_ring_into_its_log(run_root: Path) -> None:
    run_dir = run_root / "runs" / "crashy"
    run_dir.mkdir(mode=0o700, parents=True)
    _crash_child(run_dir, logged=40, ringed=100)
    assert (run_dir / "ring").exists()
    out = cli("gc", root=run_root)
    assert out.returncode == 0, out.stderr
    assert "moved 60 step(s) from the ring into the log" in out.stdout
    assert not (run_dir / "ring").exists()
    run = load_run(run_dir)
    assert len(run) == 100 and run.status == "crashed"
    assert list(run["step"].astype(int)) == list(range(100))
    assert not [w for w in run.warnings if "checksum" in w]
    ls = cli("ls", "--all", "--json", root=run_root)
    assert [r["state"] for r in json.loads(ls.stdout)] == ["crashed"]
    assert fold_ring_into_log(run_dir) == (0, "no ring file")


def test_a_reused_pid_does_not_make_a_ringless_run_look_running(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        meta = make_meta("reused", 1)
        meta.pid = sleeper.pid  # a live process, younger than the run
        meta.started = time.time() - 3600
        run_dir = tmp_path / "run"
        write_log(run_dir, meta, range(3))
        (run_dir / END_FILE).unlink()
        info = registry.inspect_dir(run_dir)
        assert info is not None and info.state == "crashed" and info.alive is False
    finally:
        sleeper.kill()
        sleeper.wait()
