"""``--root ROOT`` is where runs are looked up, in every command that looks runs up: a run under
another root than ``$NNWATCH_RUN_DIR`` is found by ``ctl`` and ``open`` when ``--root`` names it,
and not without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.test_channel_faults import Trainer, wait_for


def _nnwatch(env: dict[str, str], *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nnwatch", *words], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip


def test_ctl_and_open_look_under_root(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    root = Path(subprocess_env["NNWATCH_RUN_DIR"])
    elsewhere = {**subprocess_env, "NNWATCH_RUN_DIR": str(tmp_path / "elsewhere")}
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "100", "--name", "rooted")
    try:
        wait_for(lambda: trainer.published() > 5, timeout=30)
        missed = _nnwatch(elsewhere, "ctl", "rooted", "hello")
        assert missed.returncode == 1 and "no registered run matches" in missed.stderr
        found = _nnwatch(elsewhere, "ctl", "--root", str(root), "rooted", "hello")
        assert found.returncode == 0, found.stderr
        assert "rooted" in found.stdout
    finally:
        trainer.kill()
    # the run on disk, by name: `open` resolves it under --root (then wants a terminal)
    missed = _nnwatch(elsewhere, "open", trainer.run_dir.name)
    assert missed.returncode == 1 and "not a directory nor a run name" in missed.stderr
    opened = _nnwatch(elsewhere, "open", "--root", str(root), trainer.run_dir.name)
    assert opened.returncode == 1 and "needs a terminal" in opened.stderr, opened.stderr
