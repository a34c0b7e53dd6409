"""Issue 33, items 4-8: no step is lost or misreported after the end of a run.

Real files, real processes and a real full tmpfs: ``gc`` keeps a ring it cannot read (4), an
empty or short ``scalars.crc`` is reported instead of switching checksums off (5), ``show`` and
``replay`` refuse snapshot files that no longer match their manifest's sha256 (6), ``check
RUN_DIR`` reads the events and ``end.json`` and says what the log is missing (7), and
``lost_records`` counts exactly the records missing from the log (8).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nnwatch.store.run_reader import load_run
from nnwatch.store.runlog import SCALARS_FILE, RunLogWriter, crc_path
from nnwatch.store.schema import RunMeta
from nnwatch.testing.synthetic import make_meta
from tests.fixtures import snapshot_runs
from tests.small_disk import fill

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
pytestmark = pytest.mark.timeout(180)


def cli(*args: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    if root is not None:
        env["NNWATCH_RUN_DIR"] = str(root)
    return subprocess.run(
        [PYTHON, "-m", "nnwatch", *args], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=150,
    )  # fmt: skip


def records(meta: RunMeta, steps: range) -> np.ndarray:
    """Healthy records: unmeasured fields NaN, a falling loss, a steady grad norm and LR."""
    rows = np.zeros(len(steps), dtype=meta.schema.record_dtype())
    for name in meta.schema.scalar_dtype().names or ():
        if rows.dtype[name].base.kind == "f":
            rows[name] = np.nan
    rows["step"] = np.arange(steps.start, steps.stop, dtype=np.float64)
    rows["loss"] = 2.0 / (1.0 + rows["step"].astype(np.float32) / 100)
    rows["grad_norm"] = 1.0
    rows["lr"] = 1e-3
    rows["layer_stats"] = 0.0
    rows["nonfinite_grads"] = 0.0
    return rows


def write_log(run_dir: Path, meta: RunMeta, steps: range) -> RunLogWriter:
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    w = RunLogWriter(run_dir, meta)
    for r in records(meta, steps):
        w.put(r.tobytes())
    w.close("finished", steps.stop)
    return w


# -- 6: show and replay check the manifest's sha256 ---------------------------------------------


@pytest.fixture(scope="module")
def table_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trust-snap")
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        return snapshot_runs.table_run(root / "table")
    finally:
        mp.undo()


def flip_tensor_bytes(path: Path, n: int = 8) -> None:
    """Flip ``n`` bytes inside the first tensor's storage of a ``torch.save`` file: it still loads,
    as other numbers (the damage a bad disk or a partial copy does)."""
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    name_len, extra_len = (
        int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little"),
        int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little"),
    )
    at = info.header_offset + 30 + name_len + extra_len
    for i in range(at, at + min(n, info.file_size)):
        data[i] ^= 0x7F
    path.write_bytes(bytes(data))


def test_show_and_replay_refuse_a_snapshot_file_that_fails_its_sha256(
    table_snapshot: Path, tmp_path: Path
) -> None:
    ok = cli("show", str(table_snapshot))
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "step-8"
    shutil.copytree(table_snapshot, bad)
    flip_tensor_bytes(bad / "batch.pt")
    out = cli("show", str(bad))
    assert out.returncode == 1, out.stdout
    assert "batch.pt does not match the sha256" in out.stderr and "Traceback" not in out.stderr
    assert "#7" not in out.stdout  # nothing from the damaged batch was printed
    shutil.rmtree(bad)
    shutil.copytree(table_snapshot, bad)
    flip_tensor_bytes(bad / "state.pt")
    out = cli("replay", str(bad), "--model", "tests.fixtures.snapshot_runs:make_lm")
    assert out.returncode == 2, out.stdout
    assert "state.pt does not match the sha256" in out.stderr and "Traceback" not in out.stderr
    assert "thread" not in out.stdout + out.stderr  # no misleading advice on damaged weights


# -- 5 and 8: a disk that fills between a block's rows and its checksum -------------------------


def full_disk_run(tmpfs: Path, *, before: int = 40, after: int = 200) -> tuple[Path, RunLogWriter]:
    """A run log on a real tmpfs that fills up while the run goes on: the first ``before`` steps
    are logged with their checksums, then the disk is filled to the last byte. The next block's
    rows still fit in the page ``scalars.bin`` already holds, but the first checksum entry needs a
    page of its own: exactly what a full /dev/shm leaves behind."""
    run_dir = tmpfs / "run"
    run_dir.mkdir(mode=0o700)
    meta = make_meta("full", 2)
    meta.pid = 999_999
    w = RunLogWriter(run_dir, meta, interval=60)
    w.events.event({"type": "finding", "kind": "nan_loss", "severity": "critical", "step": 5,
             "summary": "the loss is NaN"})  # fmt: skip
    for r in records(meta, range(before)):
        w.put(r.tobytes())
    w._drain()
    fill(tmpfs / "filler")
    for r in records(meta, range(before, before + after)):
        w.put(r.tobytes())
    w._drain()
    w.close("finished", before + after)
    return run_dir, w


def rows_in_log(run_dir: Path, meta: RunMeta) -> int:
    size = (run_dir / SCALARS_FILE).stat().st_size
    return (size - 64) // meta.schema.scalar_size


def test_lost_records_counts_exactly_the_records_missing_from_the_log(tmpfs: Path) -> None:
    run_dir, w = full_disk_run(tmpfs, before=3, after=3000)
    end = json.loads((run_dir / "end.json").read_text())
    in_log = rows_in_log(run_dir, w.meta)
    assert 3 < in_log < 3003, in_log  # some rows of the failing block landed
    assert end["lost_records"] == 3003 - in_log, (end["lost_records"], 3003 - in_log)


def test_an_empty_checksum_file_beside_logged_rows_is_reported(tmpfs: Path) -> None:
    run_dir, w = full_disk_run(tmpfs, before=0, after=30)
    assert (crc_path(run_dir / SCALARS_FILE)).stat().st_size == 0
    assert rows_in_log(run_dir, w.meta) > 0
    (tmpfs / "filler").unlink()
    # damage the loss of the first row, as a bad disk would
    data = bytearray((run_dir / SCALARS_FILE).read_bytes())
    off = 64 + w.meta.schema.scalar_dtype().fields["loss"][1]
    data[off : off + 4] = b"\x01\x02\x03\x00"
    (run_dir / SCALARS_FILE).write_bytes(bytes(data))
    run = load_run(run_dir)
    assert any("not verified" in x and "scalars.crc (it is empty)" in x for x in run.warnings), run.warnings
    short = bytearray((run_dir / SCALARS_FILE).read_bytes())  # a .crc that is cut mid-entry
    (run_dir / "scalars.crc").write_bytes(b"\0" * 7)
    run = load_run(run_dir)
    assert any("not verified" in x for x in run.warnings), run.warnings
    assert short  # the rows are still loaded: reported, not hidden


# -- 7: nnwatch check RUN_DIR reads the events and end.json too -----------------------------------


def test_check_says_what_the_log_is_missing_and_fails(tmpfs: Path) -> None:
    run_dir, w = full_disk_run(tmpfs, before=40, after=1500)
    (tmpfs / "filler").unlink()
    out = cli("check", str(run_dir))
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout + out.stderr
    in_log = rows_in_log(run_dir, w.meta)
    assert f"holds {in_log} of 1540 steps" in text, text
    assert f"{1540 - in_log} record(s) were lost" in text
    assert "the loss is NaN" in text and "critical" in text  # recorded in events.jsonl
    assert "disk is full" in text
    report = json.loads(cli("check", str(run_dir), "--json").stdout)
    assert report["missing_steps"] == 1540 - in_log and report["errors"] >= 1


def test_check_on_a_log_of_no_readable_rows_reports_instead_of_crashing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    meta = make_meta("empty", 2)
    meta.pid = 999_999
    write_log(run_dir, meta, range(120))
    with open(run_dir / SCALARS_FILE, "r+b") as fh:
        fh.truncate(64)  # the header only: 0 readable rows
    out = cli("check", str(run_dir))
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 1, out.stdout + out.stderr
    assert "holds 0 of 120 steps" in out.stdout + out.stderr
    (run_dir / SCALARS_FILE).write_bytes(b"")  # not even a header
    out = cli("check", str(run_dir))
    assert "Traceback" not in out.stderr and out.returncode == 1, out.stdout + out.stderr


def test_check_on_a_complete_healthy_log_still_passes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    meta = make_meta("fine", 2)
    meta.pid = 999_999
    write_log(run_dir, meta, range(50))
    out = cli("check", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
