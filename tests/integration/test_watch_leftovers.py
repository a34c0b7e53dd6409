"""What a watch leaves behind (issue 33, items 12 and 13): a notebook cell that builds its model
and watches it under one name, run again and again, leaves one open run (one ring, one set of
threads, one registry entry) and ``ctl NAME`` reaches it; a watch with monitoring off has no run
directory (``None``, never the working directory)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.store.registry import list_runs
from tests.conftest import PYTHON

CELL = """
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
w = nnwatch.watch(model, opt, name="nb")
for _ in range(5):
    x = torch.randn(8, 4)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    w.step(loss)
"""


def _rings(run_root: Path) -> list[Path]:
    return sorted(run_root.glob("runs/*/ring"))


def test_a_cell_that_builds_its_model_run_4_times_leaves_one_watch(
    run_root: Path, capsys: pytest.CaptureFixture[str], subprocess_env: dict[str, str]
) -> None:
    scope: dict[str, Any] = {"nnwatch": nnwatch, "torch": torch, "nn": nn}
    exec(CELL, scope)  # noqa: S102 - a notebook cell, run as the kernel runs it
    first = scope["w"]
    threads_one = threading.active_count()
    watches = [first]
    for _ in range(3):
        exec(CELL, scope)  # noqa: S102
        watches.append(scope["w"])
    try:
        assert [w.closed for w in watches] == [True, True, True, False]
        mine = [r for r in list_runs() if r.pid == os.getpid() and r.name == "nb"]
        assert len(mine) == 1 and mine[0].run_dir == str(watches[-1].run_dir)
        assert len(_rings(run_root)) == 1  # the closed runs removed their rings
        assert threading.active_count() == threads_one
        for w in watches[:-1]:
            end = json.loads((w.run_dir / "end.json").read_text())
            assert end["status"] == "finished" and "same name" in end["reason"]
        said = [line for line in capsys.readouterr().err.splitlines() if "already open" in line]
        assert len(said) == 3  # once per re-run
        assert "a watch named 'nb' was already open in this process" in said[0]
        ctl = subprocess.run(
            [PYTHON, "-m", "nnwatch", "ctl", "nb", "hello"],
            env=subprocess_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ctl.returncode == 0, ctl.stderr
        assert "several" not in ctl.stdout + ctl.stderr
    finally:
        watches[-1].close()


def test_two_names_in_one_process_stay_two_runs() -> None:
    models = [nn.Linear(4, 1), nn.Linear(4, 1)]
    a = nnwatch.watch(models[0], None, name="enc")
    b = nnwatch.watch(models[1], None, name="probe")
    try:
        assert not a.closed and not b.closed
    finally:
        a.close()
        b.close()


def test_a_watch_with_monitoring_off_has_no_run_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(blocker))
    w = nnwatch.watch(nn.Linear(4, 1), None, name="off")
    assert w.disabled and w.run_dir is None
    w.close()
    monkeypatch.setenv("NNWATCH_DISABLE", "1")
    w = nnwatch.watch(nn.Linear(4, 1), None, name="off")
    assert w.disabled and w.run_dir is None
    w.close()
