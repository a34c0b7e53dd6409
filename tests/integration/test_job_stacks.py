"""Every rank's stacks from a job whose ranks are blocked in C (real processes, real sockets): a
synthetic job of 3 rank processes, each serving its command socket as a trainer does, all
stuck after a second in a call that releases the GIL, as a rank waiting in a collective is.

- ``nnwatch stacks JOB`` gets every rank's main thread, in the call it is blocked in, and folds
  the three identical stacks into one; ``--json`` carries each rank's threads; a job that is
  not there is said so (exit 1);
- the local job view (``JobMonitor``: ``attach JOB`` on the node) holds every rank's stacks once
  the job is stuck, and ``nnwatch ranks JOB --json --follow`` (what ``attach --job`` reads over
  ssh) sends them;
- ``nnwatch ctl RUN stacks`` prints one rank's threads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from nnwatch.sources.job_monitor import JobMonitor
from nnwatch.store.jobs import group_jobs
from nnwatch.store.registry import list_runs
from tests.conftest import REPO

NNWATCH = [sys.executable, "-m", "nnwatch"]


@pytest.fixture
def stuck_job(subprocess_env: dict[str, str]) -> Iterator[dict[str, object]]:
    job = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic_job", "--processes", "--ranks", "3",
         "--hosts", "1", "--rate", "10", "--seconds", "0", "--stuck-after", "1", "--name", "stuck"],
        env=subprocess_env, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        assert job.stdout is not None
        ready = json.loads(job.stdout.readline() or "{}")
        assert ready.get("ready"), ready
        yield ready
    finally:
        job.terminate()
        job.wait(timeout=60)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NNWATCH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO)  # fmt: skip


def test_stacks_of_ranks_blocked_in_c_come_from_every_rank(
    stuck_job: dict[str, object], subprocess_env: dict[str, str]
) -> None:
    deadline = time.monotonic() + 60
    while True:  # every rank is in its blocking call once the stacks say so
        told = _run(subprocess_env, "stacks", "stuck")
        if told.returncode == 0 and "ranks 0-2 · wait_in_a_collective" in told.stdout:
            break
        assert time.monotonic() < deadline, told.stdout + told.stderr
        time.sleep(0.5)
    assert "3 of 3 ranks answered" in told.stdout, told.stdout
    assert "time.sleep(seconds)" in told.stdout, told.stdout  # the source line it waits on
    assert "Thread nnwatch-commands" not in told.stdout  # nnwatch's own: named, not drawn
    assert "nnwatch's own threads left out: nnwatch-commands" in told.stdout, told.stdout
    whole = _run(subprocess_env, "stacks", "stuck", "--json", "--all-threads")
    doc = json.loads(whole.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2] and not doc["error"]
    names = {t["name"] for r in doc["ranks"] for t in r["threads"]}
    assert "MainThread" in names and "nnwatch-commands" in names, names
    missing = _run(subprocess_env, "stacks", "no-such-job")
    assert missing.returncode == 1 and "no live run or job here matches" in missing.stderr

    # the local job view, and what `attach --job` reads over ssh
    import os

    os.environ["NNWATCH_RUN_DIR"] = subprocess_env["NNWATCH_RUN_DIR"]
    (job,) = [j for j in group_jobs(list_runs()) if j.distributed]
    monitor = JobMonitor(job, use_summary=False)
    try:
        view = monitor.poll()
        deadline = time.monotonic() + 60
        while len(view.stacks) < 3:
            assert time.monotonic() < deadline, view.stacks
            time.sleep(0.5)
            view = monitor.poll()
        assert all(s.threads and not s.error for s in view.stacks)
    finally:
        monitor.close()
    follow = subprocess.Popen([*NNWATCH, "ranks", "stuck", "--json", "--follow"], env=subprocess_env,
                              stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        assert follow.stdout is not None
        for line in follow.stdout:
            (entry,) = json.loads(line)["jobs"]
            if entry.get("stacks"):
                assert entry["stuck"] and [s["rank"] for s in entry["stacks"]] == [0, 1, 2]
                break
    finally:
        follow.kill()
        follow.wait()

    one = _run(subprocess_env, "ctl", "stuck", "stacks", "--rank", "1")
    assert one.returncode == 0 and "Thread MainThread (main):" in one.stdout, one.stdout + one.stderr
    assert "wait_in_a_collective" in one.stdout


