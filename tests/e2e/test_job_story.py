"""A stuck rank's stack, then a job's story told the same in every view, before and after the
launcher's teardown (issue 42, items 2 and 3), on 2 nodes x 2 ranks: two torchrun invocations,
gloo, each node with its own run root and its own real sshd on 127.0.0.1 (the ``nodes`` fixture).

1. Rank 3 stops bringing batches (``stuck_loading_data``, a Python sleep); ranks 0-2 then wait
   for it in DDP's gradient all-reduce, blocked in C. The job view over ssh shows every rank's
   stack (rank 3 in ``stuck_loading_data``, the others in ``backward``), and so do the job
   screen's stacks pane and ``nnwatch stacks job --hosts node0,node1``.
2. Rank 2 is killed with SIGKILL. torchrun stops rank 3 (SIGTERM) and, on the other node, ranks 0
   and 1 lose their peer. Every view tells that story: rank 2 killed by SIGKILL, first; rank 3
   stopped by the launcher; ranks 0 and 1 victims. Checked live, after the teardown through the
   same view, a fresh ``attach --job``'s view, ``nnwatch ls --all node0 node1``, ``nnwatch open
   job --hosts node0,node1`` in a real terminal (tmux), and ``nnwatch ranks job --json`` there.
   On node 0 alone, ``ls --all`` names no rank of its own first, and ``open RUN_ID`` opens rank 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from nnwatch.sources.job_fanout import JobFanout
from tests.conftest import REPO
from tests.e2e.test_job_multinode import Node, _free_port, _wait, nodes  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import pytestmark  # noqa: F401 - the skip mark
from tests.terminal import Terminal

pytestmark = [pytestmark, pytest.mark.slow]  # type: ignore[list-item]
REMOTE = f"env PYTHONPATH={REPO} {sys.executable} -m nnwatch"


def _start(made: list[Node], hang: Path) -> tuple[list[subprocess.Popen[str]], dict[int, Path], list[str]]:
    port = _free_port()
    procs = []
    for i, node in enumerate(made):
        env = {**os.environ, "NNWATCH_RUN_DIR": str(node.root), "OMP_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
             "--max-restarts", "0", "--rdzv-id", f"story-{port}",
             "-m", "tests.trainers.job_trainer", "--steps", "0",
             "--sleep", "0.1", "--summary-every", "0", "--hang-rank", "3",
             "--hang-file", str(hang)],
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


def _main_frames(view: Any, rank: int) -> list[str]:
    """The function names of a rank's main thread, as the job view holds them."""
    got = {s.rank: s for s in view.stacks}
    if rank not in got:
        return []
    main = next((t for t in got[rank].threads if t.get("main")), None)
    return [str(f[2]) for f in (main or {}).get("frames", [])]


def _stuck_view(view: Any) -> Any:
    if view is None or len(view.stacks) != 4 or any(s.error for s in view.stacks):
        return None
    if "stuck_loading_data" not in _main_frames(view, 3):
        return None
    if not all("backward" in _main_frames(view, r) for r in (0, 1, 2)):
        return None
    return view


def _story_is_right(view: Any) -> Any:
    """Rank 2 killed by SIGKILL first; 3 stopped by the launcher; 0 and 1 victims."""
    if view is None or len(view.rows) != 4:
        return None
    stops = view.stops
    roles = {r: stops.ranks[r].role for r in stops.ranks}
    if stops.first != (2,) or roles.get(3) != "stopped_by_launcher":
        return None
    if roles.get(0) not in ("victim", "stopped_by_launcher") or roles.get(1) not in ("victim", "stopped_by_launcher"):
        return None
    # "(killed by SIGKILL)" when rank 3 read the zombie's status before torchrun reaped it, else
    # "(killed)": a race a loaded machine can lose either way
    if "(killed" not in stops.summary or not stops.summary.startswith("rank 2 died at"):
        return None
    return view


def _stacks_pane_text(fanout: JobFanout) -> str:
    from nnwatch.tui.job_app import JobApp
    from nnwatch.tui.widgets.stacks import StacksPane

    app = JobApp(fanout, interval=0.3)

    async def main() -> str:
        async with app.run_test(size=(160, 60)) as pilot:
            for _ in range(300):
                await pilot.pause(0.1)
                pane = app.query_one(StacksPane)
                if pane.view is not None and len(pane.view.stacks) == 4:
                    break
            return _text(app.query_one(StacksPane))

    return asyncio.run(main())


def _text(pane: Any) -> str:
    import io

    from rich.console import Console

    console = Console(width=156, file=io.StringIO(), record=True)
    console.print(pane._picture)
    return console.export_text()


def _ssh_words(cfg: Path) -> list[str]:
    return ["--ssh-arg=-F", f"--ssh-arg={cfg}", "--remote-nnwatch", REMOTE]


def test_a_stuck_rank_shows_its_stack_and_a_killed_rank_is_named_first_in_every_view(
    nodes: tuple[list[Node], Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    made, cfg = nodes
    hang = tmp_path / "hang"
    procs, dirs, lines = _start(made, hang)
    fanout = JobFanout("job", ["node0", "node1"], ssh_args=["-F", str(cfg)], remote_nnwatch=REMOTE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        _wait(lambda: (v := fanout.poll()) is not None and len(v.rows) == 4
              and all(r.step is not None and r.step >= 5 for r in v.rows), 120, "four ranks")  # fmt: skip

        # 1. rank 3 stops bringing batches: every rank's stack, in every stack view
        hang.write_text("")
        view = _wait(lambda: _stuck_view(fanout.poll()), 120, "every rank's stack over ssh")
        assert "stuck_loading_data" in _main_frames(view, 3)
        pane = _stacks_pane_text(fanout)
        assert "rank 3 · MainThread · stuck_loading_data" in pane, pane
        assert re.search(r"ranks 0-2 · MainThread · \S+", pane), pane
        told = subprocess.run([sys.executable, "-m", "nnwatch", "stacks", "job", "--hosts",
                               "node0,node1", *_ssh_words(cfg)], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert told.returncode == 0, told.stdout + told.stderr
        assert "4 of 4 ranks answered" in told.stdout, told.stdout
        assert "rank 3 · stuck_loading_data" in told.stdout and "loss.backward()" in told.stdout

        # 2. rank 2 killed: the story, live
        pid = int(re.search(r"-(\d+)-r2$", dirs[2].name).group(1))  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        live = _wait(lambda: _story_is_right(fanout.poll()), 60, "the story while the job ends")
        print("live:", live.stops.summary)
        for p in procs:
            p.wait(timeout=120)
        after = _wait(lambda: _story_is_right(fanout.poll()), 60, "the story after the teardown")
        print("after the teardown:", after.stops.summary)
    finally:
        fanout.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
    print("".join(lines)[-3000:])

    # a fresh attach --job after the end: every rank, the same story
    fresh = JobFanout("job", ["node0", "node1"], ssh_args=["-F", str(cfg)], remote_nnwatch=REMOTE)
    try:
        again = _wait(lambda: _story_is_right(fresh.poll()), 90, "the story in a fresh view")
        assert [r.rank for r in again.rows] == [0, 1, 2, 3]
        assert again.stops.summary == after.stops.summary
    finally:
        fresh.close()

    # ls over both nodes: the same story
    listed = subprocess.run([sys.executable, "-m", "nnwatch", "ls", "--all", "node0", "node1",
                             *_ssh_words(cfg)], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert after.stops.summary in listed.stdout, listed.stdout

    # on node 0 alone: no rank of its own named first; ranks --json lists the ended job
    env0 = {**env, "NNWATCH_RUN_DIR": str(made[0].root)}
    alone = subprocess.run([sys.executable, "-m", "nnwatch", "ls", "--all"], env=env0,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "the first rank to stop" not in alone.stdout, alone.stdout
    assert "not among those seen here (ranks 2-3 are on other nodes" in alone.stdout, alone.stdout
    ranks = subprocess.run([sys.executable, "-m", "nnwatch", "ranks", "job", "--json"], env=env0,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    jobs = json.loads(ranks.stdout)["jobs"]
    assert len(jobs) == 1 and [r["rank"] for r in jobs[0]["rows"]] == [0, 1], ranks.stdout
    run_id = str(jobs[0]["ident"]["id"]).split(":", 1)[1]  # torchelastic:story-PORT
    assert run_id.startswith("story-") and f"run id {run_id[:12]}" in alone.stdout, alone.stdout
    old = os.environ.get("NNWATCH_RUN_DIR")
    os.environ["NNWATCH_RUN_DIR"] = str(made[0].root)
    try:
        from nnwatch.cli.open import resolve_run

        d0, job = resolve_run(run_id)
        assert d0 == dirs[0] and job is not None and job.ranks == (0, 1), (d0, job)
        assert resolve_run(f"{run_id}:1")[0] == dirs[1]
    finally:
        if old is None:
            os.environ.pop("NNWATCH_RUN_DIR", None)
        else:
            os.environ["NNWATCH_RUN_DIR"] = old

    # open job --hosts in a real terminal: the ranks pane tells the same story
    words = " ".join(f"'{w}'" for w in _ssh_words(cfg))
    term = Terminal(f"{sys.executable} -m nnwatch open job --hosts node0,node1 {words} --no-nvml", env0)
    try:
        screen = term.wait_for(lambda s: "rank 2 died at" in s and "(killed" in s,
                               "the story in the ranks pane", timeout=120)  # fmt: skip
        assert "rank 3 stopped after it" in screen and "4/4 ranks via ssh" in screen, screen
        assert "stopped first (killed" in screen, screen  # rank 2's row
        term.keys("q")
        assert term.exit_status() == 0
    finally:
        term.close()
