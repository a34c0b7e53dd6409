"""Job-level findings, the job summary's view, and the host lists of ``attach --job``.

Pure functions on real rows and real files: a straggler is named with its host, one rank's loss
far from the others' median is called a data-sharding suspect (and a healthy spread is not), a
rank whose beat went silent in rank 0's ``job.json`` is reported dead while the others wait, and
a hostfile or a Slurm node list gives the hosts in order.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from nnwatch.sources.base import SourceError
from nnwatch.sources.job_fanout import expand_nodelist, parse_hosts
from nnwatch.sources.job_findings import job_findings, outliers
from nnwatch.sources.job_table import view_from_summary
from nnwatch.sources.job_view import RankSummary
from nnwatch.store.jobs import JOB_SUMMARY_FILE, Job, read_job_summary


def _row(rank: int, **kw: object) -> RankSummary:
    base: dict[str, object] = dict(
        rank=rank, host=f"node{rank // 8:02d}", pid=100 + rank, run_dir="", step=100,
        steps_per_s=10.0, loss=2.0 + 0.01 * (rank % 5), grad_norm=1.0 + 0.01 * (rank % 3),
        state="live", status="live", step_time=0.1 + 0.001 * (rank % 4), memory=1e9,
    )  # fmt: skip
    base.update(kw)
    return RankSummary(**base)  # type: ignore[arg-type]


def test_a_healthy_64_rank_job_has_no_findings() -> None:
    assert job_findings([_row(r) for r in range(64)]) == ()


def test_a_straggler_is_named_with_its_host() -> None:
    rows = [_row(r) for r in range(64)]
    rows[37] = _row(37, step_time=0.31)
    (found,) = job_findings(rows)
    assert found.kind == "straggler" and found.ranks == (37,) and found.hosts == ("node04",)
    assert "rank 37 on node04 takes 310 ms" in found.summary and "(3.0x)" in found.summary


def test_one_ranks_loss_far_from_the_median_is_a_sharding_suspect() -> None:
    rows = [_row(r) for r in range(16)]
    rows[5] = _row(5, loss=9.5)
    (found,) = job_findings(rows)
    assert found.kind == "loss_outlier" and found.ranks == (5,)
    assert "data-sharding" in found.summary and "rank 5: 9.5" in found.summary
    # a rank that went NaN is the non-finite finding's business, not an outlier
    rows[5] = _row(5, loss=math.nan, nonfinite_step=40)
    assert job_findings(rows, nan_origin=(5,))[0].kind == "first_nonfinite"


def test_outliers_need_a_real_spread_and_enough_ranks() -> None:
    assert outliers([1.0, 1.0, 1.0, 1.0, 1.001])[0] == []  # identical replicas: no false alarm
    assert outliers([1.0, 50.0])[0] == []  # two ranks have no median to speak of
    assert outliers([1.0, 1.1, 0.9, 1.05, 8.0])[0] == [4]


def _doc(now: float, *, silent_rank: int | None = None) -> dict[str, object]:
    ranks = []
    for r in range(4):
        beat = now - (3.0 if r == silent_rank else 0.1)
        ranks.append({
            "rank": r, "host": f"node{r // 2}", "pid": 10 + r, "beat_step": 50 if r != silent_rank else 41,
            "beat_at": beat, "step_seen_at": now - (3.0 if r != silent_rank else 6.0),
            "ended": None, "step": 40.0, "loss": 1.5, "grad_norm": 0.8, "step_time": 0.1,
            "nonfinite": 0.0, "first_nonfinite": -1.0, "memory": 3e8, "time": now - 1,
        })  # fmt: skip
    return {"written": now, "world_size": 4, "silent_after": 1.0, "ranks": ranks,
            "waiting": {"step": 42, "since": now - 5.0}, "closed": False}  # fmt: skip


def test_job_summary_names_the_silent_rank_the_others_wait_for(tmp_path: Path) -> None:
    now = time.time()
    (tmp_path / JOB_SUMMARY_FILE).write_text(json.dumps(_doc(now, silent_rank=2)))
    doc = read_job_summary(tmp_path)
    assert doc is not None
    job = Job("k", "job", "torchelastic", 4, 0, ())
    view = view_from_summary(doc, job, now=now)
    assert [r.rank for r in view.rows] == [0, 1, 2, 3] and view.via == "summary"
    rows = {r.rank: r for r in view.rows}
    assert rows[2].status == "killed" and view.stops.first == (2,)
    assert {rows[r].status for r in (0, 1, 3)} == {"waiting"}
    assert "rank 2 died" in view.stops.summary and "wait in a collective" in view.stops.summary
    assert "has waited 5 s for a rank" in view.note
    assert view.findings[0].kind == "rank_stopped" and view.findings[0].hosts == ("node1",)


def test_a_healthy_job_summary_reads_as_live(tmp_path: Path) -> None:
    now = time.time()
    doc = _doc(now)
    doc["waiting"] = None
    view = view_from_summary(doc, Job("k", "job", "torchelastic", 4, 0, ()), now=now)
    assert {r.status for r in view.rows} == {"live"} and not view.findings and not view.note
    assert view.rows[0].steps_per_s == pytest.approx(10.0) and view.rows[0].memory == 3e8


def test_hosts_from_a_list_a_hostfile_and_slurm(tmp_path: Path) -> None:
    assert parse_hosts("a, b,a,c") == ["a", "b", "c"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the nodes\nnode1 slots=8\n\nnode2 slots=8  # spare\n")
    assert parse_hosts(str(hostfile)) == ["node1", "node2"]
    assert parse_hosts(f"@{hostfile}") == ["node1", "node2"]
    assert expand_nodelist("gpu[01-03,07],cpu5") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]
    assert parse_hosts("slurm", env={"SLURM_JOB_NODELIST": "n[8-10]"}) == ["n8", "n9", "n10"]
    with pytest.raises(SourceError, match="no SLURM_JOB_NODELIST"):
        parse_hosts("slurm", env={})
    with pytest.raises(SourceError, match="cannot read the hostfile"):
        parse_hosts("@/nonexistent/hosts")
