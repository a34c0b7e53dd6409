"""The registry: entries are private and atomic, liveness is pid + start time + heartbeat, stale
entries (including ones whose pid was reused) are never reported live, and ``gc`` cleans them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nnwatch.channel.endpoint import RunEndpoint
from nnwatch.cli import main as cli_main
from nnwatch.store import registry, registry_entry, registry_gc
from nnwatch.store.identity import own_start_time, process_start_time, same_process, this_host
from nnwatch.store.paths import ensure_private_dir
from nnwatch.testing.synthetic import make_meta


def _endpoint(root: Path, name: str = "reg") -> RunEndpoint:
    meta = make_meta(name, 3)
    run_dir = ensure_private_dir(root / f"{name}-20250101-000000-{os.getpid()}")
    (run_dir / "meta.json").write_text(meta.to_json())
    return RunEndpoint(meta, run_dir, heartbeat=None, serve=False)


def test_entry_holds_what_a_monitor_needs_and_is_private(run_root: Path) -> None:
    end = _endpoint(run_root)
    try:
        assert end.entry_path is not None
        entry = json.loads(end.entry_path.read_text())
        for key in (
            "pid", "start_time", "host", "cmdline", "cwd", "rank", "local_rank", "world_size",
            "cuda_devices", "run_dir", "ring", "socket", "layer_names", "nnwatch_version",
        ):  # fmt: skip
            assert key in entry, key
        assert entry["pid"] == os.getpid() and entry["host"] == this_host()
        assert entry["layer_names"] == ["layer0", "layer1", "layer2"]
        assert stat.S_IMODE(os.stat(end.entry_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(end.entry_path.parent).st_mode) == 0o700
        assert not [p for p in end.entry_path.parent.iterdir() if p.name.startswith(".")]
        path = end.entry_path
    finally:
        end.close()
    assert not path.exists()
    assert registry.list_runs() == []  # unregistered at close


def test_live_run_is_listed_with_step_and_rate(run_root: Path) -> None:
    end = _endpoint(run_root)
    try:
        import numpy as np

        rec = np.zeros(1, end.meta.schema.record_dtype())
        for s in range(5):
            rec["step"] = s
            end.ring.publish(memoryview(rec.view(np.uint8)))
            time.sleep(0.01)
        (info,) = registry.list_runs()
        assert info.live and info.state == "running"
        assert info.step == 4 and info.steps_per_s is not None and info.steps_per_s > 0
        assert info.pid == os.getpid() and info.rank == 0 and info.world_size == 1
    finally:
        end.close()


def _fake_entry(root: Path, pid: int, start_time: float, host: str | None = None) -> Path:
    run_dir = ensure_private_dir(root / f"ghost-{pid}")
    entry = {
        "name": "ghost", "pid": pid, "start_time": start_time, "host": host or this_host(),
        "rank": 0, "world_size": 1, "run_dir": str(run_dir), "ring": str(run_dir / "ring"),
        "socket": None, "started": time.time() - 60,
    }  # fmt: skip
    return registry_entry.register(entry)


def test_entry_whose_pid_was_reused_is_not_live_and_gc_removes_it(run_root: Path) -> None:
    # a live process (a sleeper) now owns the pid; the entry remembers an older start time
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start_time(sleeper.pid)
        assert start is not None and same_process(sleeper.pid, start)
        stale = _fake_entry(run_root, sleeper.pid, start - 3600.0)
        (info,) = registry.list_runs()
        assert info.state == "crashed" and not info.live
        removed = registry_gc.gc()
        assert [r.entry_path for r in removed] == [str(stale)]
        assert not stale.exists()
        assert sleeper.poll() is None  # the unrelated process is untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_entry_of_a_dead_pid_is_crashed_and_gc_keeps_live_ones(run_root: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = _fake_entry(run_root, dead.pid, time.time() - 5)
    other_host = _fake_entry(run_root, 1, 1.0, host="another-host.example")
    end = _endpoint(run_root, "alive")
    try:
        states = {Path(r.entry_path): r.state for r in registry.list_runs()}
        assert states[stale] == "crashed"
        assert states[end.entry_path] in ("starting", "running")
        assert registry_gc.gc(dry_run=True) and stale.exists()  # dry run removes nothing
        removed = {Path(r.entry_path) for r in registry_gc.gc()}
        assert removed == {stale}
        assert end.entry_path.exists() and other_host.exists()  # a pid means nothing elsewhere
    finally:
        end.close()


def test_planted_symlink_entry_is_ignored(run_root: Path) -> None:
    reg = ensure_private_dir(registry_entry.registry_dir())
    target = run_root / "elsewhere.json"
    target.write_text(json.dumps({"pid": os.getpid(), "name": "planted"}))
    os.symlink(target, reg / "planted.json")
    assert registry.list_runs() == []


def test_socket_path_fits_a_unix_socket_even_under_a_deep_root(tmp_path: Path) -> None:
    short = registry_entry.socket_path(123, 0, tmp_path)
    assert short == tmp_path / "s" / "123-r0.sock"
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    path = registry_entry.socket_path(123, 2, deep)
    assert len(os.fsencode(path)) <= 107 and path.name == "123-r2.sock"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_identity_guards_against_pid_reuse() -> None:
    me = own_start_time()
    assert same_process(os.getpid(), me)
    assert not same_process(os.getpid(), me - 100.0)
    assert process_start_time(-1) is None


def test_ls_and_gc_commands(run_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _fake_entry(run_root, dead.pid, time.time() - 5)
    end = _endpoint(run_root, "shown")
    try:
        assert cli_main(["ls"]) == 0
        out = capsys.readouterr().out
        header = out.splitlines()[0].split()
        assert header == ["NAME", "PID", "HOST", "RANK", "STEP", "STEPS/S", "STATUS", "AGE"]
        assert "shown-" in out and f"ghost-{dead.pid}" in out and "crashed" in out
        assert cli_main(["ls", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert {r["name"] for r in rows} == {"shown", "ghost"}
        assert {r["name"]: r["live"] for r in rows} == {"shown": True, "ghost": False}
        assert cli_main(["gc"]) == 0
        assert f"removed ghost-{dead.pid}" in capsys.readouterr().out
        assert cli_main(["ls", "--json"]) == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["shown"]
    finally:
        end.close()
    assert cli_main(["ls", "--all"]) == 0
    out = capsys.readouterr().out
    assert "shown-" in out and "finished" in out  # the run dir is still there, now finished
