"""A real 2-process DDP job (gloo, CPU) started with torchrun, watched while it runs.

The monitor side must group both ranks into one job and show a summary row per rank; DDP's
all-reduced gradients must give ``clip_grad_norm_`` the same global norm on every rank although
each rank trains on its own data shard; and the cross-rank consistency check runs without a
false alarm.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import nnwatch
from nnwatch.sources.job_monitor import JobMonitor, summarize_runs
from nnwatch.store.jobs import group_jobs
from nnwatch.store.registry import list_runs
from tests.conftest import REPO

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
TRAINER = ["-m", "tests.trainers.ddp_trainer"]


def run_jobs(
    root: Path, variants: dict[str, list[str]], *trainer_args: str
) -> dict[str, tuple[list[Path], str]]:
    """Several 2-rank torchrun jobs of the DDP trainer at once, each with its own run root
    (``root / name``); waits for all and returns each job's run directories and output."""
    import os

    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )  # fmt: skip
    procs = {
        name: subprocess.Popen(
            [*TORCHRUN, *TRAINER, *trainer_args, *args],
            cwd=REPO, env={**env, "NNWATCH_RUN_DIR": str(root / name)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for name, args in variants.items()
    }
    out = {}
    for name, proc in procs.items():
        text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, text
        out[name] = (sorted(Path(p) for p in re.findall(r"rank \d run_dir (\S+)", text)), text)
    return out


def _wait_for(proc: subprocess.Popen[str], pattern: str, count: int, lines: list[str]) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    # two ranks print at once: their lines can arrive glued together ("rank 0 holdingrank 1 ...")
    while sum(len(re.findall(pattern, ln)) for ln in lines) < count:
        assert time.monotonic() < deadline, "\n".join(lines)
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError("the job ended early:\n" + "\n".join(lines))
        lines.append(line.rstrip())


def test_torchrun_job_is_grouped_and_ranks_agree(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*TORCHRUN, *TRAINER, "--steps", "15", "--every", "5", "--clip", "0.7", "--hold-at", "6", "--go", str(go)],
        cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        _wait_for(proc, r"rank \d holding", 2, lines)

        # live: the monitor groups both ranks into one job
        runs = list_runs()
        assert len(runs) == 2 and {r.rank for r in runs} == {0, 1}
        jobs = group_jobs(runs)
        assert len(jobs) == 1
        job = jobs[0]
        assert job.ranks == (0, 1) and job.world_size == 2 and not job.missing
        assert job.source == "torchelastic" and "2/2 ranks" in job.label
        monitor = JobMonitor(job)
        view = monitor.poll()
        monitor.close()
        assert [r.rank for r in view.rows] == [0, 1]
        for row in view.rows:
            assert row.step == 5 and row.state == "live" and row.status == "live"
            assert row.steps_per_s is not None and row.steps_per_s > 0
            assert np.isfinite(row.loss) and np.isfinite(row.grad_norm)
        assert view.rows[0].loss != view.rows[1].loss  # each rank has its own data ...
        assert view.rows[0].grad_norm == view.rows[1].grad_norm  # ... and the same gradients
        assert view.nan_origin == () and view.stragglers == ()
    finally:
        go.touch()
        out, _ = proc.communicate(timeout=90)
        lines += out.splitlines()
    assert proc.returncode == 0, "\n".join(lines)

    # finished: the whole history agrees across ranks
    view = summarize_runs(job)
    assert [r.status for r in view.rows] == ["finished", "finished"]
    r0, r1 = (nnwatch.load_run(r.run_dir) for r in job.runs)
    assert len(r0) == len(r1) == 15
    assert not np.array_equal(r0["loss"], r1["loss"])
    np.testing.assert_array_equal(r0["grad_norm"], r1["grad_norm"])
    np.testing.assert_array_equal(r0["grad_norm_clipped"], r1["grad_norm_clipped"])
    assert (r0["clipped"] == 1.0).any() and (
        r0["clipped"] == 0.0
    ).any()  # the 0.7 clip bit sometimes
    assert r0.meta.extra["job"]["id"] == r1.meta.extra["job"]["id"]
    assert Path(r1.run_dir).name.endswith("-r1")

    # the consistency check ran three times (steps 5, 10, 15) and found nothing
    text = "\n".join(lines)  # the two ranks' lines can arrive glued together
    assert "rank 0 checks 3 diverged 0" in text and "rank 1 checks 3 diverged 0" in text
    assert not view.cross_rank_findings


SHARED_RUN_DIR = """
import json, os, sys, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import nnwatch
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
norms = []
with nnwatch.watch(model, opt, name="shared", run_dir=sys.argv[1]) as w:  # the same on both ranks
    for step in range(20):
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
        w.step(loss)
line = f"rank {rank} run_dir {w.run_dir} norms {json.dumps(norms)}\\n"
os.write(1, line.encode())  # one write: the two ranks' lines never splice
dist.destroy_process_group()
"""


def test_one_run_dir_given_to_every_rank_keeps_each_ranks_log_apart(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """One script for every rank passes one ``run_dir``: each rank writes ``<run_dir>-r<rank>``
    (two logs in one directory interleaved both ranks' rows under rank 0's description), and the
    norms each records are the ones torch's clip returned on that rank, step by step."""
    script = tmp_path / "train.py"
    script.write_text(SHARED_RUN_DIR)
    shared = tmp_path / "runs" / "exp"
    done = subprocess.run(
        [*TORCHRUN, str(script), str(shared)], cwd=tmp_path, env=subprocess_env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.findall(r"rank (\d) run_dir (\S+) norms (\[.*?\])", done.stdout)
    assert sorted(rank for rank, _, _ in found) == ["0", "1"], done.stdout
    assert not shared.exists()
    for rank, run_dir, norms in found:
        assert Path(run_dir) == tmp_path / "runs" / f"exp-r{rank}"
        run = nnwatch.load_run(run_dir)
        assert run.meta.rank == int(rank) and run["step"].tolist() == list(range(20))
        np.testing.assert_allclose(run["grad_norm"], json.loads(norms), rtol=1e-6)
