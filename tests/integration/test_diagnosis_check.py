"""``nnwatch check RUN_DIR``: the detectors over a recorded run, from the command line.

Real runs are recorded with ``nnwatch.watch`` in a real training loop, then diagnosed by the CLI in a
subprocess: a diverging LSTM gives an error-level finding and exit status 1 (with ``--json`` for CI),
a healthy run exits 0, and the pre-flight ``MODULE:FACTORY`` form is still what a non-directory means.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pathologies import diverging, healthy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _check(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nnwatch", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
    )


def test_check_run_dir_reports_divergence_and_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path))
    w = diverging.lstm_absurd_lr({"channel": False})
    env = {"NNWATCH_RUN_DIR": str(tmp_path)}
    text = _check(str(w.run_dir), env=env)
    assert text.returncode == 1, text.stderr
    assert "loss diverging" in text.stdout and "[error]" in text.stdout
    out = _check(str(w.run_dir), "--json", env=env)
    assert out.returncode == 1
    report = json.loads(out.stdout)
    kinds = [f["kind"] for f in report["findings"]]
    assert "loss_diverging" in kinds and report["errors"] >= 1
    div = next(f for f in report["findings"] if f["kind"] == "loss_diverging")
    assert div["evidence"]["loss_now"] > 10 * div["evidence"]["loss_before"]
    assert "now 10" in div["remedy"]  # the LR the run used, cited


def test_check_run_dir_on_a_healthy_run_exits_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path))
    w = healthy.mlp_adam({"channel": False})
    out = _check(str(w.run_dir), "--json", env={"NNWATCH_RUN_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["errors"] == 0 and report["steps"] == 250


def test_check_without_a_run_dir_is_still_the_preflight_form(tmp_path):
    out = _check("no_such_module:make", env={"NNWATCH_RUN_DIR": str(tmp_path)})
    assert out.returncode == 2
    assert "cannot find module 'no_such_module'" in out.stderr
