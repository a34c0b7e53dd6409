"""Issue 33, items 2-4: ``nnwatch gc`` and the liveness it rests on, with real processes.

- 2: a dead registry entry may name any socket path and any run directory; gc unlinks only
  sockets in nnwatch's own socket directories, and never offers to fold a live run's ring.
- 3: a trainer in another PID namespace (``unshare --pid``, the host's run root, same host
  name) is judged by its ring heartbeat, not by a pid that means something else here.
- 4: a crashed run's ring that gc cannot read (a newer format, a damaged header) is kept and
  named, never removed after "moving 0 steps".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nnwatch.store import registry, registry_entry
from nnwatch.store.identity import this_host
from nnwatch.store.paths import ensure_private_dir
from nnwatch.store.ring import RingWriter
from nnwatch.store.ring_layout import CONST_OFF
from nnwatch.store.runlog import RunLogWriter
from nnwatch.store.schema import RunMeta
from nnwatch.testing.synthetic import make_meta

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
pytestmark = pytest.mark.timeout(180)


def cli(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [PYTHON, "-m", "nnwatch", *args], env=env, capture_output=True, text=True, timeout=120
    )


def dead_pid() -> int:
    p = subprocess.Popen([PYTHON, "-c", "pass"])
    p.wait()
    return p.pid


def dead_entry(root: Path, *, run_dir: Path, ring: Path, sock: str | None) -> Path:
    """A registry entry of a process that is gone, naming whatever paths it likes."""
    entry = {
        "name": "ghost", "pid": dead_pid(), "start_time": time.time() - 30,
        "host": this_host(), "rank": 0, "world_size": 1, "run_dir": str(run_dir),
        "ring": str(ring), "socket": sock, "started": time.time() - 30,
    }  # fmt: skip
    return registry_entry.register(entry, root)


def start_trainer(root: Path, *prefix: str, name: str = "synthetic") -> tuple[subprocess.Popen[str], dict]:
    """The synthetic trainer (ring, heartbeat, socket, registry entry), stepping until stopped."""
    env = dict(os.environ, NNWATCH_RUN_DIR=str(root), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [*prefix, PYTHON, "-m", "nnwatch.testing.synthetic", "--steps", "0", "--rate", "50",
         "--layers", "2", "--name", name],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(5)
        pytest.fail(f"the trainer did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, json.loads(line)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- 2 --------------------------------------------------------------------------------------------


def test_gc_never_unlinks_a_socket_outside_nnwatchs_directories(run_root: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-program"
    other.mkdir()
    path = other / "service.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        ghost_dir = ensure_private_dir(run_root / "ghost")
        entry = dead_entry(run_root, run_dir=ghost_dir, ring=ghost_dir / "ring", sock=str(path))
        out = cli("gc", root=run_root)
        assert out.returncode == 0, out.stderr
        assert path.exists(), "gc deleted another program's live socket"
        assert not entry.exists()  # the dead entry itself is cleaned up
        assert "not in nnwatch's socket directory" in out.stderr, out.stderr
    finally:
        server.close()


def test_gc_dry_run_never_offers_to_fold_a_live_runs_ring(run_root: Path) -> None:
    proc, info = start_trainer(run_root)
    try:
        run_dir = Path(info["run_dir"])
        dead_entry(run_root, run_dir=run_dir, ring=Path(info["ring"]), sock=info["socket"])
        time.sleep(0.3)
        out = cli("gc", "--dry-run", root=run_root)
        assert out.returncode == 0, out.stderr
        assert "would move the ring" not in out.stdout, out.stdout
        out = cli("gc", root=run_root)
        assert Path(info["ring"]).exists() and Path(info["socket"]).exists(), out.stdout
        assert proc.poll() is None
        states = [r.state for r in registry.list_runs(run_root)]
        assert states == ["running"], states
    finally:
        stop(proc)


# -- 3 --------------------------------------------------------------------------------------------


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if r.returncode == 0 else f"unshare --pid is not allowed here: {r.stderr!r}"


#: A container of its own: a new PID namespace, whose pid 1 (the trainer) dies with ``unshare``
#: (``--kill-child``; pid 1 of a namespace ignores the SIGTERM a test's clean-up sends).
CONTAINER = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def test_a_trainer_in_another_pid_namespace_is_live_and_gc_leaves_it(run_root: Path) -> None:
    why = _can_unshare()
    if why:
        pytest.skip(why)
    proc, info = start_trainer(run_root, *CONTAINER)
    try:
        assert info["pid"] != proc.pid  # the pid it registered means nothing on this side
        time.sleep(1.5)
        ls = json.loads(cli("ls", "--all", "--json", root=run_root).stdout)
        assert [r["state"] for r in ls] == ["running"], ls
        out = cli("gc", root=run_root)
        assert out.returncode == 0, out.stderr
        assert Path(info["entry"]).exists() and Path(info["socket"]).exists(), out.stdout
        assert Path(info["ring"]).exists()
        assert "process is gone" not in out.stdout
    finally:
        stop(proc)


def test_two_containers_sharing_dev_shm_and_host_name_are_two_runs(run_root: Path) -> None:
    """Issue 43, item 4: two trainers, each pid 1 in a PID namespace of its own, one run root and
    one host name (two containers sharing /dev/shm): two entries, two sockets, both steerable
    (before: one entry, the second "commands from monitors are off ([Errno 98] ...)")."""
    why = _can_unshare()
    if why:
        pytest.skip(why)
    first, a = start_trainer(run_root, *CONTAINER, name="box-a")
    try:
        second, b = start_trainer(run_root, *CONTAINER, name="box-b")
        try:
            assert a["pid"] == b["pid"] == 1, (a, b)
            assert a["entry"] != b["entry"] and a["socket"] != b["socket"]
            assert a["socket"] != "None" and b["socket"] != "None", (a, b)
            ls = json.loads(cli("ls", "--all", "--json", root=run_root).stdout)
            assert sorted((r["name"], r["state"]) for r in ls) == [
                ("box-a", "running"), ("box-b", "running")], ls  # fmt: skip
            for name in ("box-a", "box-b"):
                said = cli("ctl", name, "hello", root=run_root)
                assert said.returncode == 0 and name in said.stdout, said.stdout + said.stderr
        finally:
            stop(second)
    finally:
        stop(first)


# -- 4 --------------------------------------------------------------------------------------------


def records(meta: RunMeta, steps: range) -> np.ndarray:
    rows = np.zeros(len(steps), dtype=meta.schema.record_dtype())
    rows["step"] = np.arange(steps.start, steps.stop, dtype=np.float64)
    rows["loss"] = 1.0
    return rows


def crashed_run(run_dir: Path, logged: int, ringed: int) -> None:
    """A trainer that logs ``logged`` steps, publishes ``ringed`` to its ring, and is killed."""
    pid = os.fork()
    if pid == 0:
        try:
            meta = make_meta("crashy", 2)
            w = RunLogWriter(run_dir, meta)
            ring = RingWriter(run_dir / "ring", meta.schema.record_size, slots=256,
                              meta_json=meta.to_json())  # fmt: skip
            for i, r in enumerate(records(meta, range(ringed))):
                ring.publish(memoryview(r.tobytes()))
                if i < logged:
                    w.put(r.tobytes())
            w._drain()
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("damage", ["newer-format", "bad-magic"])
def test_gc_keeps_a_ring_it_cannot_read_and_names_it(run_root: Path, damage: str) -> None:
    run_dir = run_root / "runs" / "crashy"
    run_dir.mkdir(mode=0o700, parents=True)
    crashed_run(run_dir, logged=40, ringed=172)  # 132 steps only the ring holds
    ring = run_dir / "ring"
    data = bytearray(ring.read_bytes())
    if damage == "newer-format":
        data[CONST_OFF : CONST_OFF + 4] = (2).to_bytes(4, "little")
    else:
        data[0:8] = b"XXXXXXXX"
    ring.write_bytes(bytes(data))
    out = cli("gc", root=run_root)
    assert ring.exists(), out.stdout
    assert "removed the ring" not in out.stdout
    assert "kept the ring" in out.stdout + out.stderr, out.stdout + out.stderr
    assert ring.read_bytes() == bytes(data)


def test_a_recorded_run_from_another_pid_namespace_is_judged_by_its_heartbeat(tmp_path: Path) -> None:
    """``load_run`` and ``ls --all`` on a run directory (no registry entry) whose meta.json and
    ring name another namespace: pid 1 there is not this host's init."""
    import mmap

    from nnwatch.store.ring_layout import PID_NS_OFF, U64

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    meta = make_meta("contained", 2)
    meta.pid = 1
    meta.started = time.time()  # younger than this host's pid 1: a pid check would say "reused"
    meta.extra["pid_ns"] = 4_000_000_123
    log = RunLogWriter(run_dir, meta)
    ring = RingWriter(run_dir / "ring", meta.schema.record_size, slots=256, meta_json=meta.to_json())
    with open(run_dir / "ring", "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        U64.pack_into(mm, PID_NS_OFF, 4_000_000_123)
        HEADER_PID_OFF = CONST_OFF + 24  # the writer's pid in the constant header
        mm[HEADER_PID_OFF : HEADER_PID_OFF + 8] = (1).to_bytes(8, "little")
    try:
        for r in records(meta, range(5)):
            ring.publish(memoryview(r.tobytes()))
            log.put(r.tobytes())
        from nnwatch.store.run_reader import load_run

        assert load_run(run_dir).status == "running"
        info = registry.inspect_dir(run_dir)
        assert info is not None and info.state == "running", info
    finally:
        ring.close("crashed")
        log.close("crashed", 5)
