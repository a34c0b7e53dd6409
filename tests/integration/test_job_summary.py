"""The job summary through the job's own process group, on real 2-rank torchrun jobs (gloo, CPU).

- With ``job_summary_every=2`` rank 0 writes ``job.json``: every rank's step, loss, grad norm,
  step time and memory, equal to what each rank recorded in its own run log, and each rank's end.
- With nnwatch on rank 0 only, the summary's collective would be unmatched: the ranks agree
  through the job's store that it is off, rank 0 writes no table, and the job runs to its end.
- The consistency check and the job summary share one slot: with both on, every check and every
  summary completes on both ranks (no collective left unmatched).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from nnwatch.sources.job_table import view_from_summary
from nnwatch.store.jobs import JOB_SUMMARY_FILE, group_jobs, read_job_summary, run_info_from_dir
from nnwatch.store.run_reader import load_run
from tests.integration.test_distributed_ddp import run_jobs

pytestmark = pytest.mark.slow
TRAINER = ["-m", "tests.trainers.job_trainer", "--steps", "12", "--summary-every", "2"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Path], str]]:
    import tests.integration.test_distributed_ddp as ddp

    variants = {
        "summary": [],
        "rank0-only": ["--watch-ranks", "0"],
        "with-check": ["--every", "3", "--loss-scale", "1", "3.0"],
    }
    saved = ddp.TRAINER
    ddp.TRAINER = TRAINER  # run_jobs starts this trainer instead of the DDP one
    try:
        return run_jobs(tmp_path_factory.mktemp("job-summary"), variants)
    finally:
        ddp.TRAINER = saved


def test_rank_0_publishes_every_ranks_row(jobs: dict[str, tuple[list[Path], str]]) -> None:
    dirs, text = jobs["summary"]
    assert len(dirs) == 2, text
    doc = read_job_summary(dirs[0])
    assert doc is not None and doc["closed"] and doc["world_size"] == 2
    assert read_job_summary(dirs[1]) is None  # rank 0 publishes; the others only contribute
    for row, run_dir in zip(doc["ranks"], dirs, strict=True):
        run = load_run(run_dir)
        steps = run.scalars["step"].astype(np.int64)
        assert row["host"] and row["pid"] == int(re.search(r"-(\d+)-r\d$", run_dir.name)[1])  # type: ignore[index]
        assert row["ended"]["status"] == "finished"
        # the last table was launched at step 11 (the 12th optimizer step), from the records
        # published by then: its loss is one of the rank's own recorded losses
        assert int(row["step"]) == 11
        assert np.isclose(run.scalars["loss"][steps <= 11], row["loss"]).any()
        assert row["memory"] > 0 and row["step_time"] > 0 and row["nonfinite"] == 0
    assert "rank 0 done summaries 6" in text and "rank 1 done summaries 6" in text
    job = group_jobs([run_info_from_dir(dirs[0])])[0]
    view = view_from_summary(doc, job)
    assert [r.status for r in view.rows] == ["finished", "finished"] and view.via == "summary"


def test_summary_turns_itself_off_when_a_rank_has_no_nnwatch(
    jobs: dict[str, tuple[list[Path], str]],
) -> None:
    dirs, text = jobs["rank0-only"]
    assert len(dirs) == 1, text
    assert not (dirs[0] / JOB_SUMMARY_FILE).exists()
    assert "rank 0 done summaries 0" in text  # nothing launched: no collective left unmatched


def test_check_and_summary_share_the_slot(jobs: dict[str, tuple[list[Path], str]]) -> None:
    dirs, text = jobs["with-check"]
    assert "rank 0 done summaries 6" in text and "rank 1 done summaries 6" in text
    doc = read_job_summary(dirs[0])
    assert doc is not None and doc["table_step"] == 11
    losses = [r["loss"] for r in doc["ranks"]]
    assert losses[1] > 2 * losses[0]  # rank 1's loss is scaled by 3 (its own record says so)
    events = [json.loads(ln) for ln in (dirs[1] / "events.jsonl").read_text().splitlines() if ln]
    assert not [e for e in events if e.get("kind") == "rank_divergence"]  # the replicas agree
