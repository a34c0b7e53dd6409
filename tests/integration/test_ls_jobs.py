"""``nnwatch ls`` on a real 2-rank torchrun job (gloo, CPU): both ranks under one job line,
indented, and a ``"job"`` key in every ``--json`` row."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nnwatch.cli import main as cli_main
from tests.conftest import REPO
from tests.integration.test_distributed_ddp import TORCHRUN, TRAINER, _wait_for


def test_ls_groups_the_ranks_of_a_job(
    tmp_path: Path, subprocess_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*TORCHRUN, *TRAINER, "--steps", "4", "--every", "2", "--hold-at", "2", "--go", str(go)],
        cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        _wait_for(proc, r"rank \d holding", 2, lines)
        assert cli_main(["ls"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].split()[0] == "NAME"
        job_lines = [i for i, ln in enumerate(out) if ln.startswith("job ")]
        assert len(job_lines) == 1, out
        i = job_lines[0]
        assert "2/2 ranks here" in out[i] and "ddp" in out[i]
        ranks = out[i + 1 : i + 3]
        assert all(ln.startswith("  ddp") for ln in ranks), out
        assert [ln.split()[3] for ln in ranks] == ["0/2", "1/2"]
        assert all(ln.split()[6] == "running" for ln in ranks), out

        assert cli_main(["ls", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert len(rows) == 2
        jobs = [r["job"] for r in rows]
        assert jobs[0] == jobs[1] and jobs[0]["ranks"] == [0, 1] and jobs[0]["world_size"] == 2
        assert jobs[0]["missing"] == [] and jobs[0]["source"] == "torchelastic"
        assert all(r["live"] for r in rows)
    finally:
        go.touch()
        try:
            out_rest, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out_rest, _ = proc.communicate()
        lines += out_rest.splitlines()
    assert proc.returncode == 0, "\n".join(lines)

    # finished: `ls --all` still groups the ranks
    assert cli_main(["ls", "--all"]) == 0
    out = capsys.readouterr().out
    assert sum(ln.startswith("job ") for ln in out.splitlines()) == 1, out
    assert out.count("  ddp") == 2 and "finished" in out
