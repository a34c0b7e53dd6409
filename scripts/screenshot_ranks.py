"""Make the README's ranks-pane screenshot: ``python scripts/screenshot_ranks.py``.

A synthetic 64-rank job on 8 simulated hosts (``nnwatch.testing.synthetic_job``: real rings and
run logs, 10 steps/s a rank) with a straggler (rank 37) and a rank whose loss is off (rank 5),
followed by the real ``JobMonitor`` and drawn by the job screen (``attach --job``'s ranks pane) at
160x48, written to ``screenshots/ranks-64-160x48.svg`` (Textual's export).

Then a stuck job: 16 rank processes (``synthetic_job --processes``), every one blocked in a call
that releases the GIL, as ranks waiting in a collective are, drawn by the same job screen with
its stacks pane: ``screenshots/job-stacks-160x48.svg``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def without_prefix(svg: str, prefix: str) -> str:
    """The screenshot with ``prefix`` (this checkout's path) cut from the stack lines, each span
    padded with as many spaces so the line keeps its width: no machine's path in the repo."""
    out, at = [], 0
    while (i := svg.find(prefix, at)) >= 0:
        end = svg.index("</text>", i)
        out += [svg[at:i], svg[i + len(prefix) : end], "&#160;" * len(prefix)]
        at = end
    return "".join(out) + svg[at:]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="nnw-shot-") as root:
        os.environ["NNWATCH_RUN_DIR"] = root
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "nnwatch.testing.synthetic_job", "--ranks", "64", "--hosts",
             "8", "--rate", "10", "--seconds", "0", "--layers", "2", "--straggler", "37",
             "--loss-rank", "5"],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            dirs = json.loads(proc.stdout.readline())["run_dirs"]
            from nnwatch.sources.job_monitor import JobMonitor
            from nnwatch.store.jobs import group_jobs, run_info_from_dir
            from nnwatch.tui.job_app import JobApp
            from nnwatch.tui.widgets.ranks import RanksPane

            (job,) = group_jobs([run_info_from_dir(d) for d in dirs])
            app = JobApp(JobMonitor(job), interval=0.5)

            async def shoot() -> None:
                async with app.run_test(size=(160, 48)) as pilot:
                    pane = app.query_one(RanksPane)
                    for _ in range(300):
                        await pilot.pause(0.1)
                        v = pane.view
                        if v is not None and any(r.rank == 37 and r.behind >= 20 for r in v.rows):
                            break
                    out = REPO / "screenshots"
                    app.save_screenshot("ranks-64-160x48.svg", path=str(out))
                    print(out / "ranks-64-160x48.svg")

            asyncio.run(shoot())
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        stuck_shot(env)
    return 0


def stuck_shot(env: dict[str, str]) -> None:
    """The job screen of a stuck job: the ranks, and every rank's stacks under them."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nnwatch.testing.synthetic_job", "--processes", "--ranks", "16",
         "--hosts", "2", "--rate", "10", "--seconds", "0", "--stuck-after", "2",
         "--name", "stuckjob"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())
        from nnwatch.sources.job_monitor import JobMonitor
        from nnwatch.store.jobs import group_jobs
        from nnwatch.store.registry import list_runs
        from nnwatch.tui.job_app import JobApp
        from nnwatch.tui.widgets.stacks import StacksPane

        (job,) = [j for j in group_jobs(list_runs()) if j.distributed and j.runs[0].name == "stuckjob"]
        app = JobApp(JobMonitor(job, use_summary=False), interval=0.5)

        async def shoot() -> None:
            async with app.run_test(size=(160, 48)) as pilot:
                for _ in range(600):
                    await pilot.pause(0.1)
                    v = app.query_one(StacksPane).view
                    if v is not None and len(v.stacks) == 16:
                        break
                await pilot.pause(0.5)
                out = REPO / "screenshots"
                app.save_screenshot("job-stacks-160x48.svg", path=str(out))
                shot = out / "job-stacks-160x48.svg"
                shot.write_text(without_prefix(shot.read_text(), str(REPO) + "/"))
                print(shot)

        asyncio.run(shoot())
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
