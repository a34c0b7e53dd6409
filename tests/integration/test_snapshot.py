"""Snapshots from real training runs: contents, clean weights, atomic writes, and failures that
become findings instead of crashes (a path that is not a directory, a file-size limit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

import nnwatch
from nnwatch.diagnosis import Finding
from nnwatch.diagnosis.replay import load_snapshot
from nnwatch.probe.watch import internals

ROOT = Path(__file__).resolve().parents[2]
PATHOLOGIES = ROOT / "tests" / "pathologies"
sys.path.insert(0, str(ROOT / "tests"))


def _env(run_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["NNWATCH_RUN_DIR"] = str(run_root)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _train_nan_log(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    proc = subprocess.run(
        [sys.executable, str(PATHOLOGIES / "nan_log.py"), "--steps", "50"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1]), proc


def test_first_nonfinite_step_is_snapshotted_with_clean_weights(tmp_path):
    run_dir, proc = _train_nan_log(tmp_path)
    snaps = sorted((run_dir / "snapshots").iterdir())
    assert [p.name for p in snaps] == ["step-40"]  # automatic, once, at the first non-finite step
    snap = load_snapshot(snaps[0])
    man = snap.manifest
    assert man["reason"] == "nonfinite" and man["step"] == 40 and man["has"]["batch"]
    assert man["torch_version"] == torch.__version__ and man["device"] == "cpu"
    assert man["weights"] == "before this step's optimizer update"
    state = snap.state()  # weights_only=True inside
    assert set(state) >= {"model", "optimizer"}
    assert all(torch.isfinite(t).all() for t in state["model"].values())  # weights still clean
    x, y = snap.batch()
    assert x.shape == (32, 16) and x[3].abs().max() > 100  # the corrupt sample is in it
    assert set(snap.rng()) >= {"torch"}
    metrics = snap.metrics()
    assert len(metrics) == 40 and metrics["step"][0] == 0 and metrics["step"][-1] == 39
    assert "act_zero" in metrics.dtype.names and "grad_layer" in metrics.dtype.names
    layers = json.loads((snaps[0] / "layers.json").read_text())
    assert set(layers["layers"]) == {"body.0", "body.1", "body.2"}
    assert any(f["kind"] == "nan_or_inf" for f in snap.findings())
    record = json.loads((snaps[0] / "record.json").read_text())
    assert record["step"] == 40 and record["loss"] is None and record["loss_bits"] == "0x7fc00000"
    for name, digest in man["files"].items():
        import hashlib

        assert hashlib.sha256((snaps[0] / name).read_bytes()).hexdigest() == digest
    assert not [
        p for p in (run_dir / "snapshots").iterdir() if p.name.startswith(".")
    ]  # no temp left
    # the finding reached stderr once, through logging, for users without a monitor
    assert proc.stderr.count("step 40: nan or inf") == 1
    events = [e for e in nnwatch.load_run(run_dir).events if e.get("type") == "snapshot"]
    assert events and events[0]["path"] == str(snaps[0])


def test_skip_nonfinite_keeps_the_model_trainable(tmp_path, monkeypatch):
    from pathologies import nan_log

    monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path))
    torch.set_num_threads(1)
    w = nan_log.train({"skip_nonfinite": True, "channel": False}, steps=60)
    assert all(torch.isfinite(p).all() for p in internals(w).model.parameters())
    run = nnwatch.load_run(w.run_dir)
    assert [e["step"] for e in run.events if e.get("type") == "skipped_step"] == [40]
    assert np.isfinite(run["loss"][41:]).all()  # training went on after the bad batch
    nan = [f for f in w.findings if isinstance(f, Finding) and f.kind == "nan_or_inf"]
    assert len(nan) == 1 and nan[0].step == 40 and nan[0].evidence["from_guard"] == 1.0


def _tiny_loop(w, model, opt, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss, batch=(x,))


def test_a_failed_snapshot_is_a_finding_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = nnwatch.watch(model, opt, channel=False)
    (w.run_dir / "snapshots").write_text("not a directory")  # every snapshot write must fail
    _tiny_loop(w, model, opt, 3)
    w.request_snapshot("requested")
    _tiny_loop(w, model, opt, 5)
    w.close()
    assert w.step_index == 8  # training went on
    failed = [f for f in w.findings if isinstance(f, Finding) and f.kind == "snapshot_failed"]
    assert len(failed) == 1 and failed[0].step == 3 and failed[0].severity == "error"
    assert "not a directory" in failed[0].summary.lower() or "exists" in failed[0].summary.lower()
    run = nnwatch.load_run(w.run_dir)
    assert [e["kind"] for e in run.findings] == ["snapshot_failed"]
    assert [e["step"] for e in run.events if e.get("type") == "snapshot_failed"] == [3]


DISK_FULL = textwrap.dedent(
    """
    import resource, signal, sys, torch, nnwatch
    torch.set_num_threads(1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    limit = 400_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # state_dict ~1 MB: over the limit
    w = nnwatch.watch(model, opt, channel=False)
    for step in range(12):
        if step == 4:
            w.request_snapshot("requested")
        x = torch.randn(8, 512)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        w.step(loss, batch=(x,))
    w.close()
    print(w.run_dir)
    print(sorted(f.kind for f in w.findings if hasattr(f, "kind")))
    """
)


def test_a_full_disk_during_a_snapshot_is_a_finding(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(proc.stdout.splitlines()[-2])
    assert proc.stdout.splitlines()[-1] == "['snapshot_failed']"
    assert list((run_dir / "snapshots").iterdir()) == []  # the partial snapshot was removed
    run = nnwatch.load_run(run_dir)
    assert len(run) == 12 and run.status == "finished"
    (finding,) = run.findings
    assert finding["kind"] == "snapshot_failed" and finding["step"] == 4  # asked before its forward
    assert "disk" in finding["remedy"]
