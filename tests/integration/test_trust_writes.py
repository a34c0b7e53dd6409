"""Issue 43, items 5 and 8: every file nnwatch writes is opened without following a link, in a
directory no other user could have put there; directories nnwatch makes are private whatever the
umask.

- ``export``: a second real user's symlink in the output directory (``OUT/<run>``, or ``OUT``
  itself in a shared sticky directory) is refused by name; before, a root-owned event file was
  written into the directory the link pointed at.
- ``NNWATCH_RUN_DIR`` with missing parents under ``umask 000``: the parents are made 0700 and the
  run records (before: parents 0777 without the sticky bit, the trainer refused its own directory
  and the run had no log).
- the class: a scan of nnwatch's code for files opened to write, directories made, and paths
  written, outside the store's no-follow openers.
"""

from __future__ import annotations

import ast
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.testing.fixture import FixtureSource, write_run
from tests.conftest import REPO
from tests.other_user import as_other

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def shared() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nnw-shared-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def export(run: Path, out: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("tensorboard", reason="export needs the tensorboard extra")
    return subprocess.run([PYTHON, "-m", "nnwatch", "export", "tensorboard", str(run), str(out)],
                          capture_output=True, text=True, timeout=120, cwd="/")  # fmt: skip


@pytest.mark.parametrize("where", ["run-dir-link", "out-dir-link"])
def test_export_never_follows_another_users_symlink(shared: Path, tmp_path: Path, where: str) -> None:
    run = write_run(FixtureSource(50), tmp_path / "myrun")
    victim = shared / "victim"
    as_other("mkdir", "-m", "0777", str(victim))  # the other user's directory, open to all
    if where == "run-dir-link":
        out = shared / "tb"  # root's own sticky OUT, shared with the team
        out.mkdir()
        os.chmod(out, 0o1777)
        as_other("ln", "-s", str(victim), str(out / "myrun"))  # OUT/<run> made ahead, theirs
    else:
        out = shared / "tb-link"
        as_other("ln", "-s", str(victim), str(out))
    done = export(run, out)
    assert done.returncode != 0, done.stdout
    assert "symlink" in done.stderr and "nnwatch export" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(victim.iterdir()) == []  # nothing written where the link pointed


def test_export_into_a_directory_of_ones_own_works(tmp_path: Path) -> None:
    run = write_run(FixtureSource(50), tmp_path / "myrun")
    done = export(run, tmp_path / "tb")
    assert done.returncode == 0, done.stderr
    (written,) = (tmp_path / "tb" / "myrun").iterdir()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600


LOOP = """
import torch, nnwatch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with nnwatch.watch(model, opt, name="umask") as w:
    for _ in range(5):
        opt.zero_grad()
        loss = model(torch.randn(3, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss)
print("disabled", w.disabled or "", flush=True)
"""


def test_missing_parents_of_the_run_root_are_private_under_umask_000(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOOP))
    root = tmp_path / "a" / "b" / "root"
    env = dict(os.environ, NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(["sh", "-c", f"umask 000 && exec {PYTHON} {script}"], env=env,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "monitoring is off" not in done.stderr, done.stderr
    for d in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    (run,) = (root / "runs").iterdir()
    assert (run / "scalars.bin").stat().st_size > 64


#: Where nnwatch may open a file to write by path, and why that is safe there.
WRITE_SITES = {
    "nnwatch/sources/remote.py": "ssh.err in its own mkdtemp directory (0700)",
    "nnwatch/sources/job_fanout.py": "<n>.err in its own mkdtemp directory (0700)",
    "nnwatch/sources/demo_trainer.py": "output.txt in its own mkdtemp directory (0700)",
    "nnwatch/store/bundle.py": "pull's staging: mkdir 0700 inside a checked staging directory",
}


def _writes(tree: ast.AST) -> list[int]:
    """Lines that open a file for writing by path, make a directory, or write a path's bytes."""
    return [node.lineno for node in _write_calls(tree)]


def _write_calls(tree: ast.AST) -> list[ast.Call]:
    """The calls that open a file for writing by path, make a directory, or write a path's bytes."""
    lines: list[ast.Call] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("write_text", "write_bytes", "mkdir", "makedirs", "symlink_to"):
            lines.append(node)
        if name == "open" and isinstance(f, ast.Name) and len(node.args) >= 2:
            mode = node.args[1]
            if isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
                lines.append(node)
    return lines


def test_every_write_goes_through_the_stores_no_follow_openers() -> None:
    found = {}
    for path in sorted((REPO / "nnwatch").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel == "nnwatch/store/paths.py" or rel in WRITE_SITES or rel.startswith("nnwatch/testing/"):
            continue
        lines = _writes(ast.parse(path.read_text()))
        if lines:
            found[rel] = lines
    # the probe's fresh run directory: mkdir(0o700) of a new name under the private root, and
    # nothing else written by path in that module
    site = REPO / "nnwatch/probe/run_files.py"
    calls = [ast.get_source_segment(site.read_text(), node) for node in _write_calls(ast.parse(site.read_text()))]
    assert calls == ["path.mkdir(mode=0o700)"]
    found.pop("nnwatch/probe/run_files.py", None)
    assert found == {}, found
