"""Which rank stopped a real 2-rank torchrun job (gloo, CPU), and which rank the others wait for.

- SIGKILL of rank 1: torchrun ends rank 0 a moment later, so both processes are gone; ``nnwatch
  ls --json`` must say, within 2 s of the kill, that rank 1 was killed first and that rank 0 was
  stopped after it (by the launcher), and the text listing names rank 1.
- SIGSTOP of rank 1: rank 0 lives on, stuck in the gradient all-reduce; ``ls`` must say that
  rank 1 is frozen and holds the job, and that rank 0 waits in a collective, since when.
Plus the judgement itself on hand-made ranks: deaths too close to order, a failed collective
never taken for the cause, Ctrl-C on every rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import pytest

from nnwatch.cli import main as cli_main
from nnwatch.store.job_health import judge_job
from nnwatch.store.registry import list_runs
from tests.conftest import REPO
from tests.integration.test_distributed_ddp import TORCHRUN, TRAINER


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*TORCHRUN, *TRAINER, "--steps", "2000", "--every", "50", "--sleep", "0.05"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _pid_of_stepping_rank(rank: int, proc: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        runs = {r.rank: r for r in list_runs()}
        if len(runs) == 2 and all(r.step is not None and r.step >= 3 for r in runs.values()):
            return runs[rank].pid
        assert time.monotonic() < deadline, runs
        time.sleep(0.1)


def _ls_json(capsys: pytest.CaptureFixture[str]) -> dict[int, dict[str, Any]]:
    assert cli_main(["ls", "--json"]) == 0
    return {r["rank"]: r for r in json.loads(capsys.readouterr().out)}


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_sigkill_of_one_rank_names_it_first_and_the_other_stopped_after(
    subprocess_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    proc = _start(subprocess_env)
    try:
        victim = _pid_of_stepping_rank(1, proc)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        rows: dict[int, dict[str, Any]] = {}
        while time.monotonic() - killed_at < 2.0:
            rows = _ls_json(capsys)
            if all((rows.get(r) or {}).get("job_role") for r in (0, 1)):
                break
            time.sleep(0.05)
        assert set(rows) == {0, 1}, rows
        one, zero = rows[1]["job_role"], rows[0]["job_role"]
        assert one is not None and zero is not None, rows
        assert one["role"] == "first" and one["how"] == "killed" and one["status"] == "killed"
        # rank 0 is a victim: its collective failed, or the launcher stopped it
        assert (zero["role"], zero["status"]) in (("stopped_by_launcher", "stopped"), ("victim", "victim"))
        stops = rows[0]["job"]["stops"]
        assert stops["first"] == [1] and stops["first_how"] == "killed"
        assert stops["summary"].startswith("rank 1 died at ")
        assert rows[1]["job"] == rows[0]["job"]
    finally:
        out = _finish(proc)
    assert proc.returncode != 0, out  # torchrun reports the failed job

    # afterwards, with both ranks gone: the same story, and in the text listing too
    rows = _ls_json(capsys)
    assert rows[1]["job_role"]["role"] == "first" and rows[0]["job_role"]["role"] != "first"
    # rank 0, alive when rank 1 died, reads its exit status from the zombie unless torchrun
    # reaped it first (a race a loaded machine can lose): then the words still name SIGKILL
    # among the ways a process vanishes without a word
    words = rows[1]["job_role"]["words"]
    assert "killed by SIGKILL" in words or "vanished without a word: SIGKILL" in words, words
    assert cli_main(["ls"]) == 0
    text = capsys.readouterr().out
    assert "rank 1 died at" in text and "(killed" in text, text
    assert "the first rank to stop" in text, text
    lines = {ln.split()[3]: ln.split() for ln in text.splitlines() if ln.startswith("  ddp")}
    assert lines["1/2"][6] == "killed" and lines["0/2"][6] in ("stopped", "victim"), text


def test_a_frozen_rank_holds_the_job_and_the_other_waits_in_a_collective(
    subprocess_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    proc = _start(subprocess_env)
    victim = 0
    try:
        victim = _pid_of_stepping_rank(1, proc)
        os.kill(victim, signal.SIGSTOP)  # no heartbeat, no step: a rank stuck for good
        deadline = time.monotonic() + 20
        while True:
            rows = _ls_json(capsys)
            roles = {r: (rows[r]["job_role"] or {}).get("role") for r in rows}
            if roles == {0: "waiting", 1: "holds"}:
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.5)
        assert rows[1]["job_role"]["how"] == "frozen" and rows[0]["job_role"]["status"] == "waiting"
        stops = rows[0]["job"]["stops"]
        assert stops["holders"] == [1] and stops["waiting"] == [0]
        summary = stops["summary"]
        assert (
            summary.startswith("rank 1 is frozen since ")
            and "rank 0 waits in a collective since " in summary
        )
        assert cli_main(["ls"]) == 0
        text = capsys.readouterr().out
        assert "rank 0 waits in a collective since" in text and "frozen" in text, text
    finally:
        if victim:
            os.kill(victim, signal.SIGKILL)  # ends the job: rank 0's all-reduce fails
        _finish(proc)


@dataclass
class _Rank:
    rank: int
    state: str = "running"
    step: int | None = 10
    heartbeat_at: float | None = 100.0
    last_step_at: float | None = 100.0
    step_interval: float | None = 0.1
    ending: dict[str, Any] | None = None
    alive: bool | None = True
    heartbeat_age: float | None = None
    seen_first_at: float | None = None


def test_judgement_on_hand_made_ranks() -> None:
    # two silent deaths 0.3 s apart (a heartbeat is 1 s): the files cannot order them
    both = [_Rank(0, "crashed", heartbeat_at=100.3, alive=False), _Rank(1, "crashed", alive=False)]
    stops = judge_job(both, now=110.0)
    assert stops.first == (0, 1) and "cannot tell which went first" in stops.summary
    # ... unless a reader saw one of them gone while the other lived
    both[1].seen_first_at = 100.1
    assert judge_job(both, now=110.0).first == (1,)

    # a failed collective is a consequence: never the first, even when its time is earlier
    gloo = {"status": "crashed", "ended": 99.0,
            "exception": {"type": "RuntimeError", "message": "Connection closed by peer"}}  # fmt: skip
    oom = {"status": "crashed", "ended": 99.5,
           "exception": {"type": "OutOfMemoryError", "message": "CUDA out of memory"}}  # fmt: skip
    stops = judge_job([_Rank(0, "crashed", ending=gloo), _Rank(1, "crashed", ending=oom)], now=120)
    assert stops.first == (1,) and stops.ranks[0].role == "victim"
    assert "OutOfMemoryError" in stops.summary and "victims of the lost peer" in stops.summary

    # one node of two after the end: both ranks here are victims, and neither is named first
    sigterm = {"status": "interrupted", "ended": 99.2, "signal": "SIGTERM",
               "reason": "SIGTERM (signal 15): terminated from outside"}  # fmt: skip
    stops = judge_job([_Rank(0, "crashed", ending=sigterm), _Rank(1, "crashed", ending=gloo)],
                      now=120, missing=(2, 3))  # fmt: skip
    assert stops.first == () and stops.ranks[1].role == "victim", stops
    assert stops.ranks[0].role == "stopped_by_launcher"
    assert "not among those seen here (ranks 2-3 are on other nodes" in stops.summary
    # the whole job: rank 2's SIGKILL read by its node-mate (exit.json), rank 3 terminated
    killed = {"status": "crashed", "ended": 98.9, "signal": "SIGKILL",
              "observed_by": "rank 3 (pid 7) on this node", "reason": "killed by SIGKILL"}  # fmt: skip
    term3 = dict(sigterm, ended=99.0)
    whole = [_Rank(0, "crashed", ending=sigterm), _Rank(1, "crashed", ending=gloo),
             _Rank(2, "crashed", ending=killed, alive=False), _Rank(3, "crashed", ending=term3)]  # fmt: skip
    stops = judge_job(whole, now=120)
    assert stops.first == (2,) and stops.summary.startswith("rank 2 died at"), stops.summary
    assert "(killed by SIGKILL, seen by rank 3" in stops.summary
    assert {r: stops.ranks[r].role for r in (0, 1, 3)} == {
        0: "stopped_by_launcher", 1: "victim", 3: "stopped_by_launcher"}
    # a SIGTERM sent by hand before any collective failed is the first cause
    early = dict(sigterm, ended=98.0)
    stops = judge_job([_Rank(0, "crashed", ending=early), _Rank(1, "crashed", ending=gloo)], now=120)
    assert stops.first == (0,) and stops.ranks[1].role == "victim"

    # Ctrl-C reaches every rank: no first rank
    ctrl_c = {"status": "interrupted", "ended": 100.0, "reason": "KeyboardInterrupt (Ctrl-C)"}
    stops = judge_job([_Rank(0, ending=ctrl_c), _Rank(1, ending=dict(ctrl_c, ended=100.01))])
    assert stops.first == () and "interrupted" in stops.summary

    # a healthy job, and a finished one: nothing to say
    assert judge_job([_Rank(0), _Rank(1)], now=100.5).summary == ""
    done = {"status": "finished", "ended": 101.0}
    assert judge_job([_Rank(0, ending=done), _Rank(1, ending=done)], now=200).summary == ""


def test_ranks_pane_names_the_first_rank_and_the_waiting_ones() -> None:
    import io

    from rich.console import Console

    from nnwatch.sources.job_monitor import RankState, build_view
    from nnwatch.store.jobs import Job
    from nnwatch.testing.fixture import FixtureSource
    from nnwatch.tui.model import RunState
    from nnwatch.tui.widgets.base import PaneContext
    from nnwatch.tui.widgets.ranks import RanksPane
    from tests.tui.test_tui_ranks import _info

    ranks = [_Rank(0, heartbeat_at=109.5), _Rank(1, "crashed", alive=False)]
    stops = judge_job(ranks, now=110.0)
    assert stops.first == (1,) and stops.waiting == (0,)
    job = Job("k", "ddp (2/2 ranks here)", "torchelastic", 2, 0, (_info(0, 2), _info(1, 2)))
    states = {r: RankState() for r in (0, 1)}
    view = build_view(job, states, {0: "hung", 1: "crashed"}, stops=stops)
    assert [r.status for r in view.rows] == ["waiting", "killed"]
    pane = RanksPane(PaneContext(RunState(FixtureSource(10).meta)))
    pane.view = view
    console = Console(width=160, file=io.StringIO(), record=True)
    console.print(pane.build())
    text = console.export_text()
    assert "← stopped first (killed" in text and "waits in a collective since" in text, text
    assert "rank 1 died at" in text and "rank 0 waits in a collective since" in text, text
