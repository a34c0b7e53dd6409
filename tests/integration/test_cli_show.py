"""``nnwatch show SNAPSHOT_DIR`` as a user runs it: a real subprocess on real snapshots from small
real training runs (tests/fixtures/snapshot_runs.py), as text, as JSON, with a decoder and a
model factory, and a wrong directory explained in words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import snapshot_runs

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def snaps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("show")
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        return {
            "table": snapshot_runs.table_run(root / "table"),
            "tokens": snapshot_runs.token_run(root / "tokens"),
        }
    finally:
        mp.undo()


def show(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "nnwatch", "show", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_text_names_the_flagged_samples_and_the_grad_norms_before(snaps: dict[str, Path]) -> None:
    out = show(str(snaps["table"]))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "snapshot of step 8" in text and "num_classes 3" in text
    assert "recorded loss nan" in text  # the step's own NaN loss, not "unknown"
    assert "#7 " in text and "target out of range (3 not in 0..2)" in text
    assert "#9 " in text and "non-finite input (1 of 6 values NaN/Inf)" in text
    assert "grad norm, steps 0..8" in text and "✕" in text  # the snapshot's step: non-finite
    assert "14 unflagged sample(s) not shown" in text
    everything = show(str(snaps["table"]), "--all")
    assert everything.stdout.count("\n#") == 16


def test_json_with_decoder_and_per_sample_loss(snaps: dict[str, Path]) -> None:
    out = show(
        str(snaps["tokens"].parent.parent),  # a run directory: its newest snapshot
        "--json",
        "--decode", "tests.fixtures.snapshot_runs:decode",
        "--model", "tests.fixtures.snapshot_runs:make_lm",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kind"] == "tokens" and report["step"] == 8
    assert report["flagged_samples"] == [2]
    s2 = report["samples"][2]
    assert "empty sequence" in s2["flags"] and s2["length"] == 0
    s0 = report["samples"][0]
    assert s0["decoded"] == snapshot_runs.decode(s0["token_ids"])
    assert isinstance(s0["loss"], float) and s0["loss"] > 0  # recomputed from the factory
    assert s2["loss"] is None  # every target ignored: the mean over no tokens is NaN
    assert report["loss_source"].startswith("the factory's loss_fn")
    assert len(report["grad_norm_before"]["steps"]) == 9


def test_a_directory_that_is_not_a_snapshot_is_explained(tmp_path: Path) -> None:
    out = show(str(tmp_path))
    assert out.returncode == 1
    assert "is not an nnwatch snapshot" in out.stderr and "Traceback" not in out.stderr
