"""A healthy 2-rank torchrun job (gloo, CPU) under nnwatch's default cost budget raises no alarm.

The budget leaves steps out of the measurement (layer output sums and, without a clip, gradient
norms are NaN there: "not measured"). Neither the cross-rank consistency check nor the per-rank
summary may read that NaN as "non-finite": before the fix, every healthy job reported
``rank_nonfinite [error]: ranks 0 and 1 went non-finite first`` at the first skipped step.
Two jobs run at once: one clipping with torch's ``clip_grad_norm_`` (whose norm is recorded on
every step) and one not clipping at all (gradient norms only on measured steps).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nnwatch
from nnwatch.sources.job_monitor import RankState, summarize_runs
from nnwatch.store.jobs import group_jobs, run_info_from_dir
from nnwatch.store.schema import RunSchema
from tests.integration.test_distributed_ddp import run_jobs

STEPS, EVERY = 60, 20


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Path], str]]:
    out = run_jobs(
        tmp_path_factory.mktemp("ddp-budget"),
        {"clip": ["--clip", "1.0"], "no-clip": ["--clip", "0"]},
        "--steps", str(STEPS), "--every", str(EVERY),
    )
    for dirs, text in out.values():
        assert len(dirs) == 2, text
    return out


@pytest.mark.parametrize("variant", ["clip", "no-clip"])
def test_healthy_job_under_the_default_budget_has_no_error_finding(
    jobs: dict[str, tuple[list[Path], str]], variant: str
) -> None:
    dirs, text = jobs[variant]
    runs = [nnwatch.load_run(d) for d in dirs]
    for run in runs:
        # the budget did leave steps out, so the NaN "not measured" was there to misread
        assert (run["layer_sums"] == 0.0).any(), "the cost budget measured every step"
        if variant == "no-clip":  # no clip: the global norm is still taken on every step
            assert np.isfinite(run["grad_norm"]).all()
            assert len(run.layers) < len(run)  # per-layer rows only on sampled steps
    assert f"rank 0 checks {STEPS // EVERY} diverged 0" in text
    assert f"rank 1 checks {STEPS // EVERY} diverged 0" in text
    assert "rank nonfinite" not in text  # nothing on stderr either
    for d in dirs:
        events = [json.loads(ln) for ln in (d / "events.jsonl").read_text().splitlines() if ln]
        kinds = [e.get("kind") for e in events]
        assert "rank_nonfinite" not in kinds, events
        assert not [e for e in events if e.get("severity") == "error"], events

    (job,) = group_jobs([run_info_from_dir(d) for d in dirs])
    view = summarize_runs(job)
    assert view.nan_origin == ()
    for row in view.rows:
        assert row.status == "finished" and row.nonfinite_step is None, row
    assert not view.cross_rank_findings


def test_rank_summary_reads_unmeasured_layer_sums_as_not_measured() -> None:
    """A layer row for a step whose stats were sampled but whose sums were skipped (NaN) is not a
    non-finite activation; a measured NaN sum still is."""
    schema = RunSchema(("a", "b"), ("Linear", "ReLU"), ("a",), 1)
    scalars = np.zeros(3, dtype=schema.scalar_dtype())
    scalars["step"] = [0, 1, 2]
    scalars["loss"] = 1.0
    scalars["layer_stats"] = 1.0
    scalars["layer_sums"] = [1.0, 0.0, 1.0]  # step 1 left out by the budget
    scalars["nonfinite_grads"] = [0.0, np.nan, 0.0]  # NaN: not measured
    layers = np.zeros(3, dtype=schema.layer_row_dtype())
    layers["step"] = [0, 1, 2]
    layers["act_sum"][1] = np.nan
    st = RankState()
    st.update(scalars[:2], layers[:2])
    assert st.nonfinite() == (None, None, None)
    layers["act_sum"][2, 1] = np.inf  # a measured step whose output held an Inf
    st.update(scalars[2:], layers[2:])
    assert st.nonfinite()[:2] == (2, "activations")
