"""Faults injected on one rank of a real 2-process torchrun job (gloo, CPU).

- A NaN in rank 1's loss: the per-rank summary shows rank 1 as the rank that went non-finite
  first (rank 0 only got NaN gradients through the all-reduce), and the consistency check puts
  that finding into *both* ranks' events, so it is visible from any node.
- A weight nudged on rank 1 only: the consistency check flags the divergence on both ranks,
  naming the parameter and the window in which it happened.

- nnwatch on rank 0 only: the check would leave an all-reduce unmatched, so it turns itself off
  (the ranks agree on it through the job's store) and the job runs to the end.

The jobs run at the same time to keep the file short.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nnwatch.sources.job_monitor import summarize_runs
from nnwatch.store.jobs import group_jobs, run_info_from_dir
from tests.integration.test_distributed_ddp import run_jobs

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
TRAINER = ["-m", "tests.trainers.ddp_trainer", "--steps", "15", "--every", "5"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Path], str]]:
    faults = {
        "nan": ["--nan-rank", "1", "--nan-step", "4"],
        "drift": ["--drift-rank", "1", "--drift-step", "7"],
        "rank0-only": ["--watch-ranks", "0"],
    }
    out = run_jobs(tmp_path_factory.mktemp("ddp-faults"), faults)
    for name, (dirs, text) in out.items():
        assert len(dirs) == (1 if name == "rank0-only" else 2), text
    return out


def _job(dirs: list[Path]):  # noqa: ANN202 - a Job
    found = group_jobs([run_info_from_dir(d) for d in dirs])
    assert len(found) == 1 and found[0].ranks == (0, 1)
    return found[0]


def test_nan_on_one_rank_is_traced_to_that_rank(jobs: dict[str, tuple[list[Path], str]]) -> None:
    dirs, _ = jobs["nan"]
    view = summarize_runs(_job(dirs))
    rank0, rank1 = view.rows
    assert view.nan_origin == (1,)
    assert rank1.status == "nan" and rank1.nonfinite_what == "loss" and rank1.nonfinite_step == 4
    assert "first rank to go non-finite" in rank1.note
    # rank 0 got NaN gradients in the same step, through the all-reduce; its own loss went NaN
    # only one step later, once the poisoned update reached its weights
    assert rank0.status == "nan" and rank0.nonfinite_what == "gradients"
    assert rank0.nonfinite_step == 4 and rank0.forward_nonfinite_step == 5

    # every rank's events name rank 1, so the finding shows up from any node
    reports = [f for f in view.cross_rank_findings if f["kind"] == "rank_nonfinite"]
    assert sorted(f["reported_by"] for f in reports) == [0, 1]
    for f in reports:
        assert f["evidence"]["origin_rank"] == 1
        assert "rank 1 went non-finite first, at step 4" in f["message"]


def test_parameter_drift_on_one_rank_is_flagged(jobs: dict[str, tuple[list[Path], str]]) -> None:
    dirs, text = jobs["drift"]
    assert "rank 0 checks 3 diverged 2" in text and "rank 1 checks 3 diverged 2" in text
    view = summarize_runs(_job(dirs))
    found = [f for f in view.cross_rank_findings if f["kind"] == "rank_divergence"]
    assert sorted(f["reported_by"] for f in found) == [0, 1]  # reported once per rank
    for f in found:
        assert f["layer"] == "0.weight" and f["severity"] == "error"
        assert f["onset_step"] == 5 and f["step"] == 9  # nudged at step 7: between these checks
        assert f["evidence"]["tensors_diverged"] == 1
    assert all(r.nonfinite_step is None for r in view.rows)
    assert not [f for f in view.cross_rank_findings if f["kind"] == "rank_nonfinite"]


def test_nnwatch_on_rank_0_only_turns_the_check_off(
    jobs: dict[str, tuple[list[Path], str]],
) -> None:
    dirs, text = jobs["rank0-only"]  # the job finished (rc 0 is checked by the fixture)
    assert "consistency check is off: nnwatch watches 1 of 2 ranks" in text
    assert "rank 0 checks 0 diverged 0" in text
    (job,) = group_jobs([run_info_from_dir(dirs[0])])
    assert job.missing == (1,)
