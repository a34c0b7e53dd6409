"""``nnwatch replay`` on snapshots from real training runs, in subprocesses: bit-for-bit
reproduction, anomaly mode naming the backward op and the user's source line, detected
mismatches, and plain-word errors for everything a user can get wrong."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nnwatch.diagnosis.replay import load_snapshot, replay

ROOT = Path(__file__).resolve().parents[2]
PATHOLOGIES = ROOT / "tests" / "pathologies"
NAN_LOG = PATHOLOGIES / "nan_log.py"
REPLAY_NET = PATHOLOGIES / "replay_net.py"


def _env(run_root: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["NNWATCH_RUN_DIR"] = str(run_root)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)


def _replay_cli(snapshot: Path, model: str, *extra: str, env: dict[str, str] | None = None):
    """The CLI in a fresh process (what a user runs)."""
    return _run(
        [sys.executable, "-m", "nnwatch", "replay", str(snapshot), "--model", model, *extra],
        env or _env(Path("/nonexistent")),
    )


def _reseal(snapshot: Path, name: str) -> None:
    """Record a deliberately changed file's sha256 in the manifest, as if it had been written so:
    the tests below are about what replay does with such a file, not about the damage check."""
    import hashlib
    import json

    man = json.loads((snapshot / "manifest.json").read_text())
    man["files"][name] = hashlib.sha256((snapshot / name).read_bytes()).hexdigest()
    man.setdefault("sizes", {})[name] = (snapshot / name).stat().st_size  # its length, too
    (snapshot / "manifest.json").write_text(json.dumps(man))


def _replay_main(capsys, snapshot: Path, model: str, *extra: str) -> tuple[int, str, str]:
    """The same CLI entry point in this process (no interpreter start-up per call)."""
    from nnwatch.cli import main

    prev = torch.get_num_threads()
    try:
        rc = main(["replay", str(snapshot), "--model", model, *extra])
    finally:
        torch.set_num_threads(prev)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def nan_snapshot(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nanlog")
    proc = _run([sys.executable, str(NAN_LOG), "--steps", "45"], _env(root))
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1]) / "snapshots" / "step-40"


@pytest.fixture(scope="module")
def dropout_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dropout")
    args = [
        sys.executable,
        str(REPLAY_NET),
        "--steps",
        "110",
        "--snapshot-at",
        "5",
        "--spike-at",
        "60",
        "--sleep",
        "0.004",
    ]
    proc = _run(args, _env(root))
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


def test_anomaly_replay_names_log_backward_and_the_users_line(nan_snapshot):
    line = next(i for i, t in enumerate(NAN_LOG.read_text().splitlines(), 1) if "NAN_LOG_LINE" in t)
    proc = _replay_cli(nan_snapshot, f"{NAN_LOG}:make", "--anomaly")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"anomaly: LogBackward0 at {NAN_LOG}:{line}" in out
    assert f"torch.log at {NAN_LOG}:{line}" in out  # the forward op that made the -inf
    assert "torch.log(p)" in out  # the source line itself is printed
    assert out.count("identical, bit for bit") == 2 and "reproduced" in out


def test_module_form_of_the_factory(nan_snapshot, capsys, monkeypatch):
    import json

    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    rc, out, err = _replay_main(capsys, nan_snapshot, "pathologies.nan_log:make", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["reproduced"] is True and d["step"] == 40 and d["loss_bits"] == "0x7fc00000"
    assert d["backward_nonfinite_module"] == "body.2"


def test_requested_and_spike_snapshots_reproduce_bit_for_bit(dropout_run, capsys):
    snaps = sorted((dropout_run / "snapshots").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    reasons = [load_snapshot(s).manifest["reason"] for s in snaps]
    assert reasons[0] == "test" and snaps[0].name == "step-5"
    assert any(
        r.startswith("grad_norm_spike") for r in reasons[1:]
    )  # asked for by the writer thread
    for i, s in enumerate(snaps):
        if i == 0:  # one in a fresh interpreter, like a user would
            proc = _replay_cli(s, f"{REPLAY_NET}:make")
            rc, out = proc.returncode, proc.stdout + proc.stderr
        else:
            rc, out, err = _replay_main(capsys, s, f"{REPLAY_NET}:make")
            out += err
        assert rc == 0, out
        assert (
            "reproduced: the loss and the gradient norm match the original step bit for bit" in out
        )


def test_python_api_and_a_detected_mismatch(dropout_run, tmp_path, capsys):
    import shutil
    import sys as _sys

    _sys.path.insert(0, str(PATHOLOGIES))
    import replay_net

    snap = dropout_run / "snapshots" / "step-5"
    prev = torch.get_num_threads()
    try:
        result = replay(snap, replay_net.make)
        assert result.reproduced and result.loss == result.original_loss
        assert result.grad_norm_bits == result.original_grad_norm_bits
        # the same step with one input value nudged must be caught as different
        bad = tmp_path / "step-5"
        shutil.copytree(snap, bad)
        x, y = torch.load(bad / "batch.pt", weights_only=True)
        x[0, 0] += 1e-3
        torch.save((x, y), bad / "batch.pt")
        _reseal(bad, "batch.pt")
        (bad / "record.json").write_text((snap / "record.json").read_text())
        changed = replay(bad, replay_net.make)
        assert not changed.reproduced and changed.loss_matches is False
    finally:
        torch.set_num_threads(prev)
    rc, out, _ = _replay_main(capsys, bad, f"{REPLAY_NET}:make")
    assert rc == 1 and "DIFFERENT" in out and "NOT reproduced" in out


def test_replay_errors_are_plain_words(nan_snapshot, tmp_path, capsys):
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import torch\ndef make():\n    return torch.nn.Linear(3, 3)\n")
    rc, _, err = _replay_main(capsys, nan_snapshot, f"{wrong}:make")
    assert rc == 2 and "builds a different model" in err and "Traceback" not in err
    rc, _, err = _replay_main(capsys, nan_snapshot, "no_such_module_xyz:make")
    assert rc == 2 and "importing 'no_such_module_xyz' failed" in err
    rc, _, err = _replay_main(capsys, tmp_path, f"{NAN_LOG}:make")
    assert rc == 2 and "not an nnwatch snapshot" in err
    rc, _, err = _replay_main(capsys, nan_snapshot, "make_without_colon")
    assert rc == 2 and "module:function" in err


class Payload:
    def __reduce__(self):  # what a malicious snapshot would carry: code run at load time
        return (print, ("pickled code ran",))


def test_pickled_code_in_a_snapshot_is_refused(nan_snapshot, tmp_path, capsys):
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(nan_snapshot, evil)
    with open(evil / "state.pt", "wb") as fh:
        pickle.dump({"model": Payload()}, fh, protocol=2)
    _reseal(evil, "state.pt")
    rc, out, err = _replay_main(capsys, evil, f"{NAN_LOG}:make")
    assert rc == 2 and "weights_only=True" in err
    assert "pickled code ran" not in out + err


def test_snapshot_without_a_batch_says_how_to_fix_it(tmp_path, capsys):
    proc = _run(
        [sys.executable, str(REPLAY_NET), "--steps", "8", "--snapshot-at", "3", "--no-batch"],
        _env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    snap = Path(proc.stdout.strip().splitlines()[-1]) / "snapshots" / "step-3"
    assert load_snapshot(snap).manifest["batch_notes"]
    rc, _, err = _replay_main(capsys, snap, f"{REPLAY_NET}:make")
    assert rc == 2 and "w.step(loss, batch=batch)" in err
