"""Job identity and grouping, on real run directories written by ``watch()`` under launcher
variables (as torchrun or a cluster launcher sets them), and the per-rank view built from them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.sources.job_monitor import RankState, build_view
from nnwatch.store.jobs import group_jobs, job_identity, run_info_from_dir


def test_job_identity_from_the_launchers_variables() -> None:
    elastic = job_identity(
        {
            "TORCHELASTIC_RUN_ID": "abc",
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "29500",
        }
    )
    assert (
        elastic is not None and elastic["id"] == "torchelastic:abc" and elastic["world_size"] == 4
    )
    # torchrun without --rdzv-id sets the run id to the string "none": the master identifies the job
    static = job_identity(
        {
            "TORCHELASTIC_RUN_ID": "none",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "n1",
            "MASTER_PORT": "1234",
        }
    )
    assert static is not None and static["id"] == "master:n1:1234" and static["source"] == "master"
    # "localhost" names a different machine on every node
    a = job_identity({"WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}, host="a")
    b = job_identity({"WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}, host="b")
    assert a is not None and b is not None and a["id"] != b["id"]
    assert job_identity({}) is None  # a plain single-process run
    unknown = job_identity({"WORLD_SIZE": "2"})
    assert unknown is not None and unknown["source"] == "unknown"


def _rank_run(
    monkeypatch: pytest.MonkeyPatch, name: str, rank: int, env: dict[str, str], steps: int = 3
) -> Path:
    for key in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, name=name) as w:
        for _ in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            opt.step()
            w.step(loss)
    return w.run_dir


def test_runs_are_grouped_into_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    port = {"MASTER_ADDR": "node7", "MASTER_PORT": "29500"}
    dirs = {
        "a0": _rank_run(monkeypatch, "a", 0, port),
        "a1": _rank_run(monkeypatch, "a", 1, port),
        "b0": _rank_run(monkeypatch, "b", 0, port),  # the same port again: a later job
        "e0": _rank_run(monkeypatch, "e", 0, {"TORCHELASTIC_RUN_ID": "r1"}),
        "e1": _rank_run(monkeypatch, "e", 1, {"TORCHELASTIC_RUN_ID": "r1"}),
        "e0-restart": _rank_run(
            monkeypatch, "e2", 0, {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "1"}
        ),
    }
    infos = {k: run_info_from_dir(v) for k, v in dirs.items()}
    assert Path(infos["a1"].run_dir).name.endswith("-r1") and infos["a1"].world_size == 2
    # ranks of a job may start a while apart; a later job on the same port starts much later
    later = dataclasses.replace(infos["b0"], started=infos["a0"].started + 3600)
    jobs = group_jobs(
        [infos["a0"], infos["a1"], later, infos["e0"], infos["e1"], infos["e0-restart"]]
    )
    by_dirs = sorted(tuple(sorted(Path(r.run_dir).name[:2] for r in j.runs)) for j in jobs)
    assert by_dirs == [("a-", "a-"), ("b-",), ("e-", "e-"), ("e2",)]
    a = next(j for j in jobs if j.runs[0].name == "a")
    assert a.ranks == (0, 1) and a.source == "master" and "master node7:29500" in a.label
    b = next(j for j in jobs if j.runs[0].name == "b")
    assert b.missing == (1,) and "1/2 ranks" in b.label
    restart = next(j for j in jobs if j.runs[0].name == "e2")
    assert restart.restart == 1 and "restart 1" in restart.label

    # within the time window, a second rank 0 on the same port is still another job
    again = group_jobs([infos["a0"], infos["a1"], infos["b0"]])
    assert sorted(len(j.runs) for j in again) == [1, 2]


def test_a_plain_run_is_a_job_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    model = nn.Linear(2, 1)
    with nnwatch.watch(model, name="solo") as w:
        model(torch.randn(1, 2)).sum().backward()
        w.step()
    info = run_info_from_dir(w.run_dir)
    (job,) = group_jobs([info])
    assert job.source == "single" and not job.distributed and job.ranks == (0,)
    assert "job" not in nnwatch.load_run(w.run_dir).meta.extra


def test_the_view_marks_stragglers_and_the_nan_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"TORCHELASTIC_RUN_ID": "view"}
    d0 = _rank_run(monkeypatch, "v", 0, env, steps=8)
    d1 = _rank_run(monkeypatch, "v", 1, env, steps=4)
    (job,) = group_jobs([run_info_from_dir(d0), run_info_from_dir(d1)])
    states = {}
    for info in job.runs:
        st = RankState()
        run = nnwatch.load_run(info.run_dir)
        st.update(np.asarray(run.scalars), np.asarray(run.layers))
        st.step_times = [0.5]  # 2 steps/s, as a real job: 4 steps behind is 2 s behind
        states[info.rank] = st
    view = build_view(job, states, {0: "live", 1: "live"})
    assert view.stragglers == (1,)
    assert view.rows[1].status == "behind" and view.rows[1].behind == 4
    assert view.rows[0].status == "live" and view.rows[0].step == 7

    # a NaN loss on rank 0 at its step 6 (once the loss had been finite): rank 0 is the origin
    run = nnwatch.load_run(d0)
    rows = np.array(run.scalars)
    rows["loss"][6:] = np.nan
    st = RankState()
    st.update(rows[:5], np.asarray(run.layers)[:0])
    st.update(rows[5:], np.asarray(run.layers)[:0])  # in two batches, as a live poll delivers it
    view = build_view(job, {0: st, 1: states[1]}, {0: "live", 1: "finished"})
    assert view.nan_origin == (0,) and view.rows[0].status == "nan"
    assert view.rows[0].nonfinite_step == 6 and view.rows[0].nonfinite_what == "loss"
    assert view.rows[1].status == "finished" and view.stragglers == ()
