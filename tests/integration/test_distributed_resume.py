"""A torchrun job resumed from its checkpoint goes on with its step count, and a loss that keeps
falling after the resume is not called stalled (a real 2-rank gloo job, twice)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import nnwatch
from tests.conftest import REPO
from tests.integration.test_distributed_ddp import TORCHRUN


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


def test_a_rank_whose_framework_exits_1_is_crashed_and_named_first(tmp_path: Path) -> None:
    """Rank 1 raises; the framework (as Hydra does) prints it and calls sys.exit(1)."""
    import json

    env = dict(os.environ)
    env.update(
        NNWATCH_RUN_DIR=str(tmp_path), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )  # fmt: skip
    dirs: dict[str, str] = {}
    for _attempt in range(2):
        done = subprocess.run(
            [*TORCHRUN, "-m", "tests.trainers.ddp_trainer", "--steps", "30", "--fail-rank", "1",
             "--fail-step", "12"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode != 0
        dirs = dict(re.findall(r"rank (\d) run_dir (\S+)", done.stdout))
        if "1" in dirs:
            break
        # rank 1 never reached its watch: torchrun's rendezvous or gloo's connect failed under
        # load (seen once in CI), which is not what this test is about; one more try, then fail
        # with the job's own words
    assert "1" in dirs, done.stdout[-2000:] + done.stderr[-4000:]
    end = json.loads((Path(dirs["1"]) / "end.json").read_text())
    # the `with` block saw the exception on its way to the framework, which then exited 1
    assert end["status"] == "crashed" and end["steps"] == 12
    assert end["exception"]["type"] == "RuntimeError" and "bad record" in end["exception"]["message"]
    listing = subprocess.run(
        [sys.executable, "-m", "nnwatch", "ls", "--all", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    rows = json.loads(listing.stdout)
    rows = rows if isinstance(rows, list) else rows.get("runs", [])
    rank1 = [r for r in rows if r.get("rank") == 1]
    assert rank1 and rank1[0].get("state") == "crashed", rank1
