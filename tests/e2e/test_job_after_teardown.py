"""A multi-node job after torchrun tears it down (issue 33, item 10), end to end on this machine:
two torchrun invocations play two nodes, each with its own run root and its own sshd on
127.0.0.1 (the ``nodes`` fixture of ``test_job_multinode``). Rank 3 goes non-finite first (its
loss is multiplied by NaN), then rank 2 is killed with SIGKILL and torchrun ends the others.

- The job view over ssh names rank 2 as the rank that died first, and still does once the
  launcher has torn the job down (its ranks ended cleanly on SIGTERM and left the registry), with
  all four rows; the killed rank is never labelled "first NaN" (rank 3 was).
- A rank's dashboard opened from the job view has a full ranks pane (the job view's own rows).
- On one node after the end: ``open job`` opens rank 0, ``open job:1`` rank 1, ``attach job``
  says to use ``open``; and no rank of this node reads "other node".
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nnwatch.sources.job_fanout import JobFanout
from tests.conftest import REPO
from tests.e2e.test_job_multinode import Node, _free_port, _wait, nodes  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import pytestmark  # noqa: F401 - the skip mark

pytestmark = [pytestmark, pytest.mark.slow]  # type: ignore[list-item]
REMOTE = f"env PYTHONPATH={REPO} {sys.executable} -m nnwatch"


def _start(made: list[Node]) -> tuple[list[subprocess.Popen[str]], dict[int, Path], list[str]]:
    port = _free_port()
    procs = []
    for i, node in enumerate(made):
        env = {**os.environ, "NNWATCH_RUN_DIR": str(node.root), "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
             "--max-restarts", "0", "-m", "tests.trainers.job_trainer", "--steps", "0",
             "--sleep", "0.1", "--summary-every", "0", "--loss-scale", "3", "nan",
             "--scale-from", "5"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))  # fmt: skip
    dirs: dict[int, Path] = {}
    lines: list[str] = []

    def pump(p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            for rank, d in re.findall(r"rank (\d) run_dir (\S+)", line):
                dirs[int(rank)] = Path(d)

    for p in procs:
        threading.Thread(target=pump, args=(p,), daemon=True).start()
    try:
        _wait(lambda: len(dirs) == 4, 180, "four ranks: " + "".join(lines)[-2000:])
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return procs, dirs, lines


def _full(view: Any) -> Any:
    if view is None or len(view.rows) != 4 or any(r.step is None or r.step < 8 for r in view.rows):
        return None
    return view


def _first_is_2(view: Any) -> Any:
    return view if view is not None and view.stops.first == (2,) else None


def _ranks_pane_text(app: Any) -> str:
    from nnwatch.tui.widgets.ranks import RanksPane

    out: dict[str, str] = {}

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                pane = app.query_one(RanksPane)
                if pane.view is not None and len(pane.view.rows) == 4:
                    break
            pane = app.query_one(RanksPane)
            out["text"] = pane.text
            out["rows"] = str(len(pane.view.rows) if pane.view is not None else 0)

    asyncio.run(main())
    return f"{out['rows']} rows\n{out['text']}"


def test_the_job_view_keeps_its_story_after_the_teardown_and_one_node_opens_the_ended_job(
    nodes: tuple[list[Node], Path],  # noqa: F811
) -> None:
    made, cfg = nodes
    procs, dirs, lines = _start(made)
    fanout = JobFanout("job", ["node0", "node1"], ssh_args=["-F", str(cfg)], remote_nnwatch=REMOTE)
    try:
        view = _wait(lambda: _full(fanout.poll()), 90, "all four ranks over ssh")
        assert view.nan_origin == (3,), (view.nan_origin, [r.forward_nonfinite_step for r in view.rows])

        # a rank's dashboard opened from the job view: its ranks pane shows the job view's rows
        from nnwatch.sources.remote import RemoteSource
        from nnwatch.testing.tui import fixed_hardware
        from nnwatch.tui.app import NNWatchApp

        host, run_dir = fanout.where[0]
        link = fanout.link_for(host)
        assert link is not None
        source = RemoteSource(host, run_dir, ssh_args=["-F", str(cfg), "-S", str(link.control),
                                                       "-o", "ControlMaster=no"], remote_nnwatch=REMOTE)  # fmt: skip
        app = NNWatchApp(source, hardware=fixed_hardware, fps=10, job_views=fanout.poll)
        shown = _ranks_pane_text(app)
        assert shown.startswith("4 rows"), shown
        assert "looking for the other ranks" not in shown

        # rank 2 killed: named first within seconds, and still after the launcher's teardown
        pid = int(re.search(r"-(\d+)-r2$", dirs[2].name).group(1))  # type: ignore[union-attr]
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: _first_is_2(fanout.poll()), 30, "the ssh view to name rank 2 first")
        print(f"rank 2 named first {time.monotonic() - killed:.2f} s after the kill")
        for p in procs:
            p.wait(timeout=90)
        ended = time.monotonic()
        views = []
        while time.monotonic() - ended < 6.0:  # the hosts report the ended ranks for a while
            views.append(fanout.poll())
            time.sleep(0.5)
        last = views[-1]
        assert last is not None and len(last.rows) == 4, [len(v.rows) if v else 0 for v in views]
        assert last.stops.first == (2,), last.stops
        assert "rank 2 died" in last.stops.summary, last.stops.summary
        row2 = next(r for r in last.rows if r.rank == 2)
        assert row2.status == "killed" and 2 not in last.nan_origin, row2
        assert last.nan_origin in ((3,), ()), last.nan_origin
        print("after the teardown:", last.stops.summary)
    finally:
        fanout.close()
        for p in procs:
            if p.poll() is None:
                p.kill()

    # on node 0 alone, after the end: open and attach by the job's name
    env = {**os.environ, "NNWATCH_RUN_DIR": str(made[0].root), "PYTHONPATH": str(REPO)}
    from nnwatch.cli.open import resolve_run

    old = os.environ.get("NNWATCH_RUN_DIR")
    os.environ["NNWATCH_RUN_DIR"] = str(made[0].root)
    try:
        d0, job = resolve_run("job")
        assert d0 is not None and Path(d0) == dirs[0], (d0, dirs)
        assert job is not None and job.ranks == (0, 1), job
        d1, _ = resolve_run("job:1")
        assert d1 is not None and Path(d1) == dirs[1]
        d00, _ = resolve_run("job:0")
        assert d00 is not None and Path(d00) == dirs[0]

        from nnwatch.sources.recorded import RecordedSource
        from nnwatch.testing.tui import fixed_hardware
        from nnwatch.tui.app import NNWatchApp

        shown = _ranks_pane_text(NNWatchApp(RecordedSource(d0), hardware=fixed_hardware, fps=10, job=job))
        assert "rank 1: other node" not in shown and "rank 0-1" not in shown, shown
        assert "rank 2-3: other node" in shown, shown
        assert "first NaN" not in shown, shown  # ranks 0 and 1 are not the whole job
    finally:
        if old is None:
            os.environ.pop("NNWATCH_RUN_DIR", None)
        else:
            os.environ["NNWATCH_RUN_DIR"] = old
    attach = subprocess.run([sys.executable, "-m", "nnwatch", "attach", "job"], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert attach.returncode == 1 and "nnwatch open job" in attach.stderr, attach.stderr
