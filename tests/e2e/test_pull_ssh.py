"""``nnwatch pull HOST:RUN [STEP]`` end to end through a real sshd on 127.0.0.1: a snapshot and a
whole finished run copied byte for byte and opened like local ones, the far side's refusals
(no such run, no such step, no host) named with their exit status, and a stream damaged or cut
on its way reported as such, with nothing left at the destination.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.channel.client import ChannelClient
from nnwatch.store.registry import find_runs
from nnwatch.store.run_reader import load_run
from tests.e2e.test_remote_ssh import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import Tunnel, pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import wait_for
from tests.small_disk import fill

REPO = Path(__file__).resolve().parents[2]
HOST = f"{getpass.getuser()}@127.0.0.1"
#: Flips one byte in the middle of rng.pt's data (``flip``) or cuts the stream in half (``cut``),
#: between the far nnwatch and ssh: what a bad link or a bad disk would do to the bytes.
DAMAGE = """
import io, subprocess, sys, tarfile
mode, cmd = sys.argv[1], sys.argv[2:]
done = subprocess.run(cmd, stdout=subprocess.PIPE)
out = bytearray(done.stdout)
if mode == "flip":
    with tarfile.open(fileobj=io.BytesIO(bytes(out))) as t:
        m = next(m for m in t.getmembers() if m.name.endswith("rng.pt"))
    out[m.offset_data + m.size // 2] ^= 0x01
else:
    out = out[: len(out) // 2]
sys.stdout.buffer.write(out)
sys.exit(done.returncode)
"""


def train(name: str, steps: int = 10, snapshots: tuple[int, ...] = (3, 7)) -> Path:
    """A real, finished run under the test's run root with snapshots at ``snapshots``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, name=name, channel=False, budget=None) as w:
        for i in range(steps):
            if i in snapshots:
                w.request_snapshot("test")
            x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
        run_dir = Path(w.run_dir)
    return run_dir


def files_of(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def pull(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> Iterator[object]:
    """``nnwatch pull`` as a user runs it, in a fresh working directory, reaching the test sshd."""
    cwd = tmp_path / "here"
    cwd.mkdir()

    def run(*argv: str, nnwatch_cmd: str | None = None) -> subprocess.CompletedProcess[str]:
        opts = [f"--ssh-arg={a}" for a in remote["ssh_args"]]  # type: ignore[attr-defined]
        opts.append(f"--remote-nnwatch={nnwatch_cmd or remote['remote_nnwatch']}")
        return subprocess.run(
            [sys.executable, "-m", "nnwatch", "pull", *argv, *opts],
            cwd=cwd, env=subprocess_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    run.cwd = cwd  # type: ignore[attr-defined]
    yield run


def test_pull_a_snapshot_byte_for_byte_and_show_it(pull: object, run_root: Path) -> None:
    run_dir = train("far-snap")
    done = pull(f"{HOST}:far-snap", "3", "--into", "mine")  # type: ignore[operator]
    assert done.returncode == 0, done.stderr
    local = pull.cwd / "mine" / "snapshots" / "step-3"  # type: ignore[attr-defined]
    there = run_dir / "snapshots" / "step-3"
    assert f"{HOST}:{there.resolve()}" in done.stdout  # where it came from, host-qualified
    assert str(local) in done.stdout
    assert files_of(local) == files_of(there) and len(files_of(local)) >= 8
    assert {oct(p.stat().st_mode)[-3:] for p in local.iterdir()} == {"600"}
    assert list((pull.cwd / "mine" / "snapshots").iterdir()) == [local]  # type: ignore[attr-defined]

    newest = pull(f"{HOST}:far-snap")  # type: ignore[operator]  # no STEP: the newest snapshot
    assert newest.returncode == 0, newest.stderr
    landed = pull.cwd / "nnwatch-pulled" / "127.0.0.1" / run_dir.name / "snapshots" / "step-7"  # type: ignore[attr-defined]
    assert files_of(landed) == files_of(run_dir / "snapshots" / "step-7")
    shown = subprocess.run(
        [sys.executable, "-m", "nnwatch", "show", str(landed), "--json"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["step"] == 7

    closest = pull(f"{HOST}:far-snap", "5", "--nearest", "--into", "near")  # type: ignore[operator]
    assert closest.returncode == 0, closest.stderr
    assert "the closest to step 5" in closest.stdout
    assert (pull.cwd / "near" / "snapshots").exists()  # type: ignore[attr-defined]


def test_pull_a_whole_finished_run_and_load_it(pull: object) -> None:
    run_dir = train("far-run", steps=40, snapshots=(5,))
    done = pull(f"{HOST}:far-run", "--run")  # type: ignore[operator]
    assert done.returncode == 0, done.stderr
    local = pull.cwd / "nnwatch-pulled" / "127.0.0.1" / run_dir.name  # type: ignore[attr-defined]
    assert f"{HOST}:{run_dir.resolve()}" in done.stdout and f"nnwatch open {local}" in done.stdout
    note = json.loads((local / "copied.json").read_text())  # a copy, and what its host said
    assert note["host"] == "127.0.0.1" and note["state"] == "finished"
    assert files_of(local) == {**files_of(run_dir), "copied.json": (local / "copied.json").read_bytes()}
    here, there = load_run(local), load_run(run_dir)
    assert here.status == there.status == "finished"
    assert len(here.scalars) == 40
    assert here.scalars.tobytes() == there.scalars.tobytes()
    assert np.array_equal(here.scalars["step"], np.arange(40))
    # a snapshot pulled before is superseded by the run that brings it again (no --force needed)
    again = pull(f"{HOST}:far-run", "5")  # type: ignore[operator]
    assert again.returncode == 0, again.stderr
    assert files_of(local) == {**files_of(run_dir), "copied.json": (local / "copied.json").read_bytes()}
    # the whole run pulled again replaces the copy without --force: every file comes again
    assert pull(f"{HOST}:far-run", "--run").returncode == 0  # type: ignore[operator]


def test_no_such_run_no_such_step_no_host_are_named(pull: object, tunnel: Tunnel) -> None:  # noqa: F811
    run_dir = train("named")
    nope = pull(f"{HOST}:nope")  # type: ignore[operator]
    assert nope.returncode == 3
    assert "no run here matches 'nope'" in nope.stderr and run_dir.name in nope.stderr
    step = pull(f"{HOST}:named", "5")  # type: ignore[operator]
    assert step.returncode == 4
    assert "no snapshot at step 5" in step.stderr and "steps 3, 7" in step.stderr
    assert "--nearest" in step.stderr
    whole = pull(f"{HOST}:named", "5", "--run")  # type: ignore[operator]
    assert whole.returncode == 2
    tunnel.close()  # the host is gone
    gone = pull(f"{HOST}:named")  # type: ignore[operator]
    assert gone.returncode == 1 and "cannot reach" in gone.stderr, gone.stderr
    assert list(pull.cwd.iterdir()) == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["flip", "cut"])
def test_a_damaged_stream_is_named_and_leaves_nothing(
    pull: object,
    remote: dict[str, object],  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    run_dir = train("damaged")
    wrapper = tmp_path / "damage.py"
    wrapper.write_text(DAMAGE)
    bad = f"{sys.executable} {wrapper} {mode} {remote['remote_nnwatch']}"
    done = pull(f"{HOST}:damaged", "3", nnwatch_cmd=bad)  # type: ignore[operator]
    assert done.returncode == 5, done.stderr
    assert "arrived damaged" in done.stderr and "nothing was written" in done.stderr
    if mode == "flip":
        assert "rng.pt" in done.stderr and "sha256" in done.stderr
    else:
        assert "cut short" in done.stderr
    assert list(pull.cwd.iterdir()) == []  # type: ignore[attr-defined] # not even its folders

    # over a good earlier copy, with --force: the damaged one never replaces it
    good = pull(f"{HOST}:damaged", "3", "--into", "keep")  # type: ignore[operator]
    assert good.returncode == 0, good.stderr
    kept = pull.cwd / "keep" / "snapshots"  # type: ignore[attr-defined]
    again = pull(f"{HOST}:damaged", "3", "--into", "keep", "--force", nnwatch_cmd=bad)  # type: ignore[operator]
    assert again.returncode == 5
    assert [p.name for p in kept.iterdir()] == ["step-3"]  # no staging folder left beside it
    assert files_of(kept / "step-3") == files_of(run_dir / "snapshots" / "step-3")


def test_a_full_disk_here_is_said_and_leaves_nothing(pull: object, tmpfs: Path) -> None:
    train("full")
    fill(tmpfs / "filler")
    done = pull(f"{HOST}:full", "--into", str(tmpfs / "run"))  # type: ignore[operator]
    assert done.returncode == 6, done.stderr
    assert "disk is full" in done.stderr and "nothing was written" in done.stderr
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]


def test_pull_from_a_live_run(pull: object, subprocess_env: dict[str, str]) -> None:
    """A snapshot asked of a running trainer, pulled while it trains; then its files as they
    stand, said to be those of a live run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "100000",
         "--delay", "0.01", "--name", "live-far"],
        stdout=subprocess.PIPE, text=True, env=subprocess_env, cwd=REPO,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().split(" ", 1)[1].strip())
        info = wait_for(lambda: next(iter(find_runs("live-far")), None), timeout=60)
        with ChannelClient(info.socket) as client:
            assert client.request("snapshot", {"reason": "from afar"}).ok
        snaps = run_dir / "snapshots"
        wait_for(
            lambda: snaps.is_dir() and any(not p.name.startswith(".") for p in snaps.iterdir()),
            timeout=30,
        )
        time.sleep(0.5)  # record.json follows its snapshot when the step's record is published
        done = pull(f"{HOST}:live-far")  # type: ignore[operator]
        assert done.returncode == 0, done.stderr
        assert "the run is running" in done.stdout
        (snap,) = [p for p in snaps.iterdir() if not p.name.startswith(".")]
        local = pull.cwd / "nnwatch-pulled" / "127.0.0.1" / run_dir.name / "snapshots" / snap.name  # type: ignore[attr-defined]
        assert files_of(local) == files_of(snap)
        whole = pull(f"{HOST}:live-far", "--run", "--into", "whole")  # type: ignore[operator]
        assert whole.returncode == 0, whole.stderr
        assert "as they stood while it wrote them" in whole.stdout
        copy = load_run(pull.cwd / "whole")  # type: ignore[attr-defined]
        assert len(copy.scalars) > 0 and copy.meta.name == "live-far"
        assert proc.poll() is None  # the trainer went on
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize("evil", ["../escape", "/etc/evil", "link"])
def test_a_stream_naming_a_path_outside_or_a_link_is_refused(tmp_path: Path, evil: str) -> None:
    """What a hostile host could send: a name that climbs out, an absolute one, a symlink.
    Nothing is written, inside the destination or beside it."""
    import io
    import tarfile

    from nnwatch.store.bundle import FORMAT, HEADER, BundleError, receive_bundle

    buf = io.BytesIO()
    header = json.dumps({"format": FORMAT, "kind": "run", "bytes": 4}).encode()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((HEADER, header), ("ok.txt", b"fine")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo(evil)
        if evil == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    dest = tmp_path / "in" / "run"
    buf.seek(0)
    with pytest.raises(BundleError, match="refused") as err:
        receive_bundle(buf, lambda h: (dest, False))
    assert evil.strip("./") in str(err.value)
    assert list(tmp_path.iterdir()) == []  # not even the folders made for it
