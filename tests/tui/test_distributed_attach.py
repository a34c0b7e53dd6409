"""``nnwatch attach NAME`` on a real 2-rank torchrun job (gloo, CPU): the ranks share the name, so
the name means the job (rank 0's dashboard with the ranks pane), and ``NAME:RANK`` one rank.

Before, every job name failed with "'ddp' matches several runs ... name one of them".
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from nnwatch.cli import main as cli_main
from nnwatch.cli.attach import open_live, resolve
from nnwatch.sources.base import SourceError
from nnwatch.testing.tui import fixed_hardware, settle, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.widgets.header import RunHeader
from nnwatch.tui.widgets.ranks import RanksPane
from tests.conftest import REPO
from tests.integration.test_distributed_ddp import TORCHRUN, TRAINER, _wait_for


def test_a_job_name_attaches_to_the_job(
    tmp_path: Path, subprocess_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*TORCHRUN, *TRAINER, "--steps", "6", "--every", "3", "--hold-at", "4", "--go", str(go)],
        cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        _wait_for(proc, r"rank \d holding", 2, lines)

        info, job = resolve("ddp")  # the name both ranks share
        assert info is not None and job is not None
        assert info.rank == 0 and job.ranks == (0, 1) and job.world_size == 2
        info1, job1 = resolve("ddp:1")  # one rank of it
        assert info1 is not None and info1.rank == 1 and job1 is not None and job1.ranks == (0, 1)
        assert resolve(str(info1.pid))[0].rank == 1  # type: ignore[union-attr]
        with pytest.raises(SourceError, match="no rank 5"):
            resolve("ddp:5")

        # the command itself gets past the name (and stops at the missing terminal)
        assert cli_main(["attach", "ddp"]) == 1
        err = capsys.readouterr().err
        assert "matches several" not in err and "needs a terminal" in err, err

        source, _, job = open_live("ddp", None)
        app = NNWatchApp(source, hardware=fixed_hardware, fps=10, job=job, ranks_interval=0.2)  # type: ignore[arg-type]

        async def main() -> None:
            async with app.run_test(size=(160, 48)) as pilot:
                await settle(pilot, app)
                pane = app.dashboard.query_one(RanksPane)
                await wait_until(pilot, lambda: pane.view is not None and len(pane.view.rows) == 2)
                await pilot.pause()
                rows = [ln.strip() for ln in pane.text.splitlines() if ln.strip()[:1] in "▶1"]
                assert rows[0].startswith("▶ 0") and rows[1].startswith("1"), pane.text
                assert "rank 0/2" in app.dashboard.query_one(RunHeader)._picture.plain
                await pilot.press("right_square_bracket")  # the other rank is one key away
                assert app.source.meta.rank == 1
                await pilot.press("q")

        asyncio.run(main())
        assert app.return_value == 0
    finally:
        go.touch()
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines += out.splitlines()
    assert proc.returncode == 0, "\n".join(lines)
