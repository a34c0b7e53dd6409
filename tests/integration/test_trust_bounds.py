"""Issue 43, item 3: a number in a registry entry or a ``meta.json`` is bounded before anything is
sized from it. ``"world_size": 1000000000`` once made ``ls --all --json`` grow to 23.8 GB (the job
grouping and the ranks pane did ``range(world_size)``); on a shared machine the OOM killer may pick
a training job instead. The readers run here under a 2 GiB address-space limit: an allocation
sized from the number would fail them."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from nnwatch.store.identity import this_host
from nnwatch.store.paths import ensure_private_dir
from nnwatch.store.schema import MAX_WORLD_SIZE
from nnwatch.testing.synthetic import make_meta
from nnwatch.tui.widgets.ranks import unseen_ranges
from tests.conftest import REPO

PYTHON = sys.executable


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_huge_world_size_is_refused_by_ls_without_allocating(run_root: Path) -> None:
    reg = ensure_private_dir(run_root / "registry")
    for i, world in enumerate((1_000_000_000, 2**31 - 1)):
        entry = {"pid": os.getpid(), "name": f"huge{i}", "host": this_host(), "rank": 1,
                 "world_size": world, "run_dir": str(run_root / "nowhere"), "ring": "ring",
                 "started": time.time()}  # fmt: skip
        (reg / f"huge{i}.json").write_text(json.dumps(entry))
        os.chmod(reg / f"huge{i}.json", 0o600)
    run = ensure_private_dir(run_root / "runs" / "copied")
    meta = json.loads(make_meta("copied", 1).to_json())
    meta["world_size"] = 1_000_000_000
    (run / "meta.json").write_text(json.dumps(meta))
    env = dict(os.environ, NNWATCH_RUN_DIR=str(run_root), PYTHONPATH=str(REPO))
    done = subprocess.run([PYTHON, "-m", "nnwatch", "ls", "--all", "--json"], env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=limited)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert done.stderr.count("world_size is out of range") == 2, done.stderr
    assert "skipped copied: its meta.json is unreadable or corrupt" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_largest_world_size_allowed_costs_what_is_shown() -> None:
    """A job that says it has 2**20 ranks, of which two are here: the ranks pane names the others
    in two ranges, from the ranks it has seen (never by walking every rank)."""
    assert unseen_ranges(MAX_WORLD_SIZE, {0, 5}) == ["1-4", f"6-{MAX_WORLD_SIZE - 1}"]
    assert unseen_ranges(4, {0, 1, 2, 3}) == []
    many = unseen_ranges(MAX_WORLD_SIZE, set(range(0, 400, 2)), most=8)
    assert len(many) == 9 and many[-1].endswith("more ranges")
