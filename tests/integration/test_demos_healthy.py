"""The healthy demo: a run that learns cleanly raises no finding at all (no false alarms).

It is the control for the other demos: the same headless command, the same detectors, and a small
CNN on scikit-learn's digits that does learn. The run is kept so that its loss curve can be read.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nnwatch

REPO = Path(__file__).resolve().parents[2]


def test_healthy_demo_learns_and_raises_nothing(
    subprocess_env: dict[str, str], run_root: Path
) -> None:
    pytest.importorskip("sklearn", reason="the healthy demo trains on sklearn's digits (dev extra)")
    out = subprocess.run(
        [sys.executable, "-m", "nnwatch", "demo", "healthy", "--headless", "--steps", "300", "--keep"],
        env=subprocess_env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == "", f"findings on a healthy run:\n{out.stdout}"
    assert "healthy: 0 finding(s)" in out.stderr
    kept = re.search(r"the run is kept in (\S+)", out.stderr)
    assert kept, out.stderr
    run = nnwatch.load_run(kept.group(1))
    assert run.status == "finished" and run.findings == []
    loss = np.asarray(run["loss"], dtype=float)
    assert len(loss) == 300 and np.isfinite(loss).all()
    assert abs(loss[0] - np.log(10)) < 0.3  # a fresh 10-class classifier starts near ln(10)
    assert np.median(loss[-50:]) < 0.25 * loss[0]  # and it learns
