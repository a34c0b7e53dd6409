"""Issue 43, items 2, 9 and 11 for snapshots: ``show`` (the reader ``replay`` shares) reads only
what it can verify, and says when it cannot.

- a manifest without its ``files`` map: the batch is shown with a "not verified" note (before:
  a damaged ``batch.pt`` was shown, exit 0, without a word);
- ``batch.pt`` extended to 3 GiB (a hole): refused at once by its recorded size, or, in a
  manifest that records none, by the hole (before: ``show`` hashed 3 GiB of zeros);
- ``batch.pt`` a FIFO, or a symlink to ``/dev/zero``, with no checksum to look it up by: refused
  in words (before: ``torch.load`` waited for a writer forever);
- ``metrics.npy`` whose header claims a huge shape: refused before numpy sizes an array from it.
The commands run under a 2 GiB address-space limit and a timeout: a hang or a balloon fails them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import snapshot_runs

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("snaps")
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        return snapshot_runs.table_run(root / "table")
    finally:
        mp.undo()


@pytest.fixture
def snap(made: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / made.name
    shutil.copytree(made, copy)
    return copy


def show(snapshot: Path) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([PYTHON, "-m", "nnwatch", "show", str(snapshot)], capture_output=True,
                          text=True, timeout=60, preexec_fn=limited, cwd="/")  # fmt: skip


def edit_manifest(snapshot: Path, drop: tuple[str, ...]) -> None:
    path = snapshot / "manifest.json"
    manifest = json.loads(path.read_text())
    for key in drop:
        manifest.pop(key, None)
    path.write_text(json.dumps(manifest))


def test_a_manifest_without_its_files_map_is_said_not_verified(snap: Path) -> None:
    edit_manifest(snap, ("files", "sizes"))
    import torch

    x, y = torch.load(snap / "batch.pt", weights_only=True)
    x[0, 0] = -6.6e27  # a damaged value, which nothing can catch without the checksums
    torch.save((x, y), snap / "batch.pt")
    done = show(snap)
    assert done.returncode == 0, done.stderr
    assert "note: not verified" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("sizes", [True, False])
def test_a_batch_extended_to_gigabytes_is_refused_without_reading_it(snap: Path, sizes: bool) -> None:
    if not sizes:
        edit_manifest(snap, ("sizes",))  # a manifest of an older nnwatch
    os.truncate(snap / "batch.pt", 3 << 30)
    done = show(snap)
    assert done.returncode == 1, done.stdout
    said = "the snapshot recorded" if sizes else "never written (a hole)"
    assert said in done.stderr and "batch.pt" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero-link"])
def test_a_batch_that_is_not_a_file_is_refused_in_words(snap: Path, kind: str) -> None:
    edit_manifest(snap, ("files", "sizes"))  # nothing to look it up by: the loader meets it
    (snap / "batch.pt").unlink()
    if kind == "fifo":
        os.mkfifo(snap / "batch.pt")
    else:
        (snap / "batch.pt").symlink_to("/dev/zero")
    done = show(snap)
    assert done.returncode == 1, done.stdout
    assert ("FIFO" if kind == "fifo" else "symlink") in done.stderr, done.stderr


def test_a_metrics_header_claiming_a_huge_array_is_refused(snap: Path) -> None:
    from nnwatch.diagnosis.snapshot_files import ReplayError, load_npy

    path = snap / "metrics.npy"
    header = {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)}
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\0" * 64)
    with pytest.raises(ReplayError, match="describes more than the file holds"):
        load_npy(path)
