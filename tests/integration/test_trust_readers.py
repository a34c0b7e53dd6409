"""Issue 43, items 2 and 9, as the report measured them: each command a user runs, on a run with
one file replaced, in a child process with a timeout and a 2 GiB address-space limit.

- a FIFO as ``events.jsonl``: ``load_run``, ``check`` and ``export`` were still blocked after
  60 s; with ``end.json`` also empty, ``ls --all`` blocked too;
- a symlink to ``/dev/zero`` as ``events.jsonl``: ``check`` grew to 571 MB and never ended;
- ``layers.bin`` extended to 3 GiB by a hole, as a crash can leave it: ``check`` took 17 s and
  4.5 GB loading 32 million unverified zero rows; ``export`` ran 150 s of CPU and was stopped.
Now each answers, in words, with the run's real steps and the hole named.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import hostile_runs
from tests.conftest import REPO

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(600)
RUN = hostile_runs.RUN


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_runs.make_base(tmp_path_factory.mktemp("readers") / "root")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO))
    return subprocess.run([PYTHON, *argv], env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limited, cwd="/")  # fmt: skip


def commands(root: Path) -> dict[str, list[str]]:
    run_dir = str(root / RUN)
    return {
        "load_run": ["-c", f"import nnwatch; r = nnwatch.load_run({run_dir!r}); print(len(r), r.warnings)"],
        "check": ["-m", "nnwatch", "check", run_dir, "--no-plot"],
        "export": ["-m", "nnwatch", "export", "tensorboard", run_dir, str(root.parent / "tb")],
        "ls": ["-m", "nnwatch", "ls", "--all"],
    }  # fmt: skip


@pytest.mark.parametrize(
    "plants",
    [
        [("events.jsonl", "fifo")],
        [("events.jsonl", "fifo"), ("end.json", "empty")],
        [("events.jsonl", "zero")],
        [("layers.bin", "hole")],
    ],
    ids=["events-fifo", "events-fifo-end-empty", "events-dev-zero", "layers-3GiB-hole"],
)
def test_every_command_answers_a_hostile_file_in_words(base: Path, tmp_path: Path, plants: list) -> None:
    pytest.importorskip("tensorboard", reason="export needs the tensorboard extra")
    root = tmp_path / "root"
    shutil.copytree(base, root, symlinks=True)
    for name, kind in plants:
        path = root / RUN / name
        if kind == "hole":  # exactly the report's: the real file, extended to 3 GiB
            os.truncate(path, 3 << 30)
        else:
            hostile_runs.plant(root, f"{RUN}/{name}", kind, 0)
    for what, argv in commands(root).items():
        done = run(root, *argv)  # a hang is a TimeoutExpired, a balloon a MemoryError
        assert "Traceback" not in done.stderr, (what, done.stderr[-2000:])
        assert done.returncode in (0, 1), (what, done.returncode, done.stderr[-2000:])
        out = done.stdout + done.stderr
        if what == "load_run":
            assert out.startswith("300 "), out  # every real step, and what was left out
        if what == "check" and plants[0][0] == "events.jsonl":
            assert "events.jsonl" in out and ("FIFO" in out or "symlink" in out), out
        if what == "check" and plants[0][0] == "layers.bin":
            assert "never written" in out and "300 of 300 steps" in out, out
        if what == "ls":
            assert "victim" in out, out
