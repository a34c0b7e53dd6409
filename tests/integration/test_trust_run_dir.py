"""Issue 33, item 1: an explicit ``run_dir`` is trusted along its whole path and opened once.

Real trainers in subprocesses, run as root, and a second real user (made with ``useradd``,
acting through ``setpriv``) who owns a symlink or a directory on the way:

- a symlink of another user in a sticky, world-writable directory is not followed;
- a run directory inside another user's directory is refused (that user could swap it for a
  symlink after the first step and redirect ``end.json``, ``overview.bin`` and snapshots);
- a run directory swapped for a symlink after the first step (by root itself, in a private
  parent) redirects nothing: every file goes through the directory opened at the first step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.store.paths import RunDirError, make_run_dir

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
OTHER = "nnwatch-other"
pytestmark = pytest.mark.timeout(180)

TRAINER = r"""
import sys
import torch
import nnwatch

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = nnwatch.watch(model, opt, name="swap", run_dir=sys.argv[1], budget=None)

def step():
    opt.zero_grad()
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    w.step(loss, batch=(x,))

step()
step()
print("first", w.disabled or "", flush=True)
sys.stdin.readline()  # the test changes the path here
w.request_snapshot("test")
for _ in range(5):
    step()
w.close()
print("done", w.run_dir, flush=True)
"""


def other_user() -> tuple[int, int]:
    """A second real user (created once), or a skip saying why there cannot be one."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a second user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    import pwd

    try:
        pw = pwd.getpwnam(OTHER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not installed")
        made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER],
                              capture_output=True, text=True)  # fmt: skip
        if made.returncode not in (0, 9):  # 9: made meanwhile
            pytest.skip(f"useradd failed: {made.stderr.strip()}")
        pw = pwd.getpwnam(OTHER)
    return pw.pw_uid, pw.pw_gid


def as_other(*cmd: str) -> None:
    uid, gid = other_user()
    subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *cmd],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


@pytest.fixture
def shared(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A world-writable sticky directory like /tmp, that the other user can reach."""
    d = Path(tempfile.mkdtemp(prefix="nnw-shared-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(run_dir: Path, run_root: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, NNWATCH_RUN_DIR=str(run_root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [PYTHON, "-c", TRAINER, str(run_dir)], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("first"), (line, proc.stderr.read() if proc.stderr else "")
    proc.first_line = line  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err  # training never crashes because of nnwatch
    return out + err


def tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_another_users_symlink_on_the_way_is_not_followed(shared: Path, run_root: Path,
                                                          tmp_path: Path) -> None:  # fmt: skip
    uid, _ = other_user()
    target = shared / "target"
    as_other("mkdir", "-m", "777", str(target))
    as_other("ln", "-s", str(target), str(shared / "link"))
    proc = start(shared / "link" / "run", run_root)
    finish(proc)
    assert tree(target) == [], tree(target)  # before the fix: the whole run landed here
    assert "symlink" in proc.first_line  # type: ignore[attr-defined]
    with pytest.raises(RunDirError, match=f"link is a symlink that belongs to uid {uid}"):
        make_run_dir(shared / "link" / "run")


def test_a_run_dir_inside_another_users_directory_is_refused(shared: Path, run_root: Path) -> None:
    uid, _ = other_user()
    theirs = shared / "theirs"
    as_other("mkdir", "-m", "755", str(theirs))
    victim = shared / "victim"
    victim.mkdir(mode=0o700)
    (victim / "end.json").write_text("root's own file")
    proc = start(theirs / "run", run_root)
    if (theirs / "run").exists():  # before the fix: the other user swaps it now
        as_other("mv", str(theirs / "run"), str(theirs / "run.old"))
        as_other("ln", "-s", str(victim), str(theirs / "run"))
    finish(proc)
    assert tree(victim) == ["end.json"], tree(victim)
    assert (victim / "end.json").read_text() == "root's own file"
    assert f"uid {uid}" in proc.first_line  # type: ignore[attr-defined]
    with pytest.raises(RunDirError, match=f"theirs belongs to uid {uid}"):
        make_run_dir(theirs / "run")


def test_a_run_dir_swapped_for_a_symlink_after_the_first_step_redirects_nothing(
    tmp_path: Path, run_root: Path
) -> None:
    run_dir = tmp_path / "parent" / "run"
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "end.json").write_text("precious")
    proc = start(run_dir, run_root)
    assert proc.first_line.strip() == "first"  # type: ignore[attr-defined]
    moved = tmp_path / "parent" / "run.moved"
    os.rename(run_dir, moved)
    os.symlink(victim, run_dir)
    finish(proc)
    assert tree(victim) == ["end.json"], tree(victim)
    assert (victim / "end.json").read_text() == "precious"
    names = tree(moved)
    for name in ("end.json", "events.jsonl", "overview.bin", "scalars.bin", "meta.json"):
        assert name in names, names
    assert any(n.startswith("snapshots/step-") and n.endswith("manifest.json") for n in names), names


def test_trusted_paths_still_work(tmp_path: Path, shared: Path) -> None:
    # an own symlink in a private directory, a sticky /tmp-like directory, missing parents
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "mine")
    assert make_run_dir(tmp_path / "mine" / "a" / "run") == tmp_path / "mine" / "a" / "run"
    assert (real / "a" / "run").is_dir()
    assert make_run_dir(shared / "deep" / "run").is_dir()
    open_world = tmp_path / "open"
    open_world.mkdir()
    os.chmod(open_world, 0o777)  # writable by all, no sticky bit: anything in it can be swapped
    with pytest.raises(RunDirError, match="every user can write"):
        make_run_dir(open_world / "run")
