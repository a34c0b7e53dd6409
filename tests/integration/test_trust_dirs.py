"""Issue 43, item 7: no other user can switch monitoring off by making nnwatch's directories first.

The per-user directories have predictable names (``/dev/shm/nnwatch-$UID``, then
``$TMPDIR/nnwatch-$UID``, and ``/tmp/nnwatch-$UID-s`` for sockets when a root is too deep), so a
second real user can make them first, mode 0777. nnwatch never uses another user's directory; it
falls back to one of this user's own with an unpredictable name, which the trainer and ``ls`` both
find again by ownership (before: "monitoring is off", and ``ls`` found nothing).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from nnwatch.store.paths import own_dir
from tests.conftest import REPO
from tests.other_user import as_other, as_other_argv

PYTHON = sys.executable
pytestmark = pytest.mark.timeout(240)

LOOP = """
import torch, nnwatch
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with nnwatch.watch(model, opt, name="taken") as w:
    for _ in range(5):
        opt.zero_grad()
        loss = model(torch.randn(3, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss)
print("disabled:", w.disabled or "no", flush=True)
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A TMPDIR like /tmp: world-writable and sticky, where the other user can make names first."""
    d = Path(tempfile.mkdtemp(prefix="nnw-tmp-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_both_default_roots_made_first_by_another_user_do_not_switch_monitoring_off(
    shared_tmp: Path, tmp_path: Path
) -> None:
    """In a private mount namespace with a fresh /dev/shm (this machine's stays untouched)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    other = " ".join(as_other_argv())
    uid = os.getuid()
    shm, tmp = f"/dev/shm/nnwatch-{uid}", shared_tmp / f"nnwatch-{uid}"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOOP))
    env = {k: v for k, v in os.environ.items() if k != "NNWATCH_RUN_DIR"}
    env.update(TMPDIR=str(shared_tmp), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    inside = (
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 77; "
        f"{other} mkdir -m 0777 {shm} {tmp} || exit 78; "
        f"{PYTHON} {script} || exit 1; echo ---ls---; {PYTHON} -m nnwatch ls --all; "
        f"echo ---theirs---; ls -A {shm} {tmp}; echo ---mine---; ls -d /dev/shm/nnwatch-{uid}.*"
    )
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inside],
                          env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    if done.returncode in (77, 78):
        pytest.skip(f"cannot make a private /dev/shm here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    assert "disabled: no" in done.stdout and "monitoring is off" not in done.stderr, done.stderr
    listed, rest = done.stdout.split("---ls---", 1)[1].split("---theirs---")
    theirs, mine = rest.split("---mine---")
    assert "taken" in listed and "finished" in listed, done.stdout  # ls found it, by ownership
    assert theirs.split() == [f"{shm}:", f"{tmp}:"]  # nothing written into their directories
    (fallback,) = mine.split()
    assert re.fullmatch(rf"/dev/shm/nnwatch-{uid}\.[0-9a-f]{{16}}", fallback), fallback
    assert f"runs go to {fallback} instead" in done.stderr, done.stderr


def test_a_taken_socket_directory_falls_back_to_an_own_one(shared_tmp: Path) -> None:
    """The same for the short socket directory, found again on each call, never theirs."""
    stem = f"nnwatch-{os.getuid()}-s"
    as_other("mkdir", "-m", "0777", str(shared_tmp / stem))
    first = own_dir(shared_tmp, stem)
    assert first != shared_tmp / stem and first.name.startswith(stem + ".")
    st = os.lstat(first)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert own_dir(shared_tmp, stem) == first  # found again, not made twice
    as_other("mkdir", "-m", "0777", str(shared_tmp / (stem + ".0000")))  # theirs sorts first
    assert own_dir(shared_tmp, stem) == first
