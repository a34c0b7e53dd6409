"""A torchrun job resumed from its checkpoint goes on with its step count, and a loss that keeps
falling after the resume is not called stalled (a real 2-rank gloo job, twice)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np

import nnwatch

from .conftest import REPO
from .test_distributed_ddp import TORCHRUN


def _job(root: Path, *args: str) -> list[Path]:
    env = dict(os.environ)
    env.update(
        NNWATCH_RUN_DIR=str(root), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )  # fmt: skip
    done = subprocess.run(
        [*TORCHRUN, "-m", "tests.trainers.ddp_trainer", "--adam", "--learnable", "--lr", "0.003",
         "--clip", "0", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    dirs = re.findall(r"rank \d run_dir (\S+)", done.stdout)
    assert len(dirs) == 2, done.stdout
    return [Path(d) for d in dirs]


def test_a_resumed_job_goes_on_counting_and_is_not_called_stalled(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    first = _job(tmp_path / "a", "--steps", "40", "--save", str(ckpt))
    resumed = _job(tmp_path / "b", "--steps", "120", "--resume", str(ckpt))
    for run_dir in first:
        assert nnwatch.load_run(run_dir)["step"].tolist() == list(range(40))
    for run_dir in resumed:
        run = nnwatch.load_run(run_dir)
        assert run["step"].tolist() == list(range(40, 160))  # the optimizer's step count goes on
        assert run.meta.extra["resumed"] is True
        loss = run["loss"]
        # the loss keeps falling after the resume (20-step means) ...
        means = loss.reshape(-1, 20).mean(axis=1)
        assert means[-1] < means[0]
        # ... and nothing calls it stalled, or says the first loss is off
        kinds = {e.get("kind") for e in run.events if e.get("type") == "finding"}
        assert not kinds & {"loss_stalled", "bad_initial_loss", "rank_nonfinite"}, kinds
        assert np.isfinite(loss).all()
