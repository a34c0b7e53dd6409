"""Issue 43, item 13: a live ring truncated under a trainer ends monitoring, never training.

A real trainer in a fast loop; another process (the same user, as only they can) cuts its ring
file to nothing, then to half, while it steps. Before, the trainer touched a lost page of its
mapping and died of SIGBUS (exit 135, status -7); now it writes through ``pwrite``, sees the cut
at its next heartbeat, says so once, and trains to the end with its whole run log."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nnwatch.store.run_reader import load_run
from tests.conftest import REPO

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(240)

TRAINER = """
import sys, time, torch, nnwatch
torch.set_num_threads(1)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with nnwatch.watch(model, opt, name="cut") as w:
    print("run_dir", w.run_dir, flush=True)
    for step in range(int(sys.argv[1])):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss)
        if step == 50:
            print("stepping", flush=True)
            sys.stdin.readline()  # the test cuts the ring here, then lets it go on
        time.sleep(0.002)
print("done", len(nnwatch.load_run(w.run_dir)), flush=True)
"""


@pytest.mark.parametrize("cut_to", [0, "half"])
def test_a_ring_cut_under_a_trainer_ends_monitoring_not_training(
    tmp_path: Path, run_root: Path, cut_to: object
) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINER))
    env = dict(os.environ, NNWATCH_RUN_DIR=str(run_root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([PYTHON, str(script), "1500"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    run_dir = Path(proc.stdout.readline().split()[1])
    assert proc.stdout.readline().strip() == "stepping"
    ring = run_dir / "ring"
    size = ring.stat().st_size
    os.truncate(ring, 0 if cut_to == 0 else size // 2)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    for _ in range(20):  # and again while it steps: a cut at any moment is survived
        time.sleep(0.05)
        os.truncate(ring, 0 if cut_to == 0 else size // 2)
    out, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, (proc.returncode, err[-2000:])  # before: -7 (SIGBUS)
    assert "done 1500" in out, out
    assert err.count("was cut to") == 1, err  # said once
    assert len(load_run(run_dir)) == 1500
