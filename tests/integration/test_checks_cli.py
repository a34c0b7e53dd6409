"""``nnwatch check module:factory`` for real: subprocesses, exit codes, text and JSON, bad factories."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FACTORIES = "tests.fixtures.check_factories"


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    # keep whatever made nnwatch importable here, and make the repo importable in the child
    env["PYTHONPATH"] = os.pathsep.join([p for p in [env.get("PYTHONPATH", ""), str(REPO)] if p])
    env["OMP_NUM_THREADS"] = "1"
    env["NNWATCH_RUN_DIR"] = str(tmp_path / "runs")
    return env


def _nnwatch(tmp_path: Path, *args: str, cwd: Path | None = None, isolated: bool = False):
    """Run ``python -m nnwatch check ...``; ``isolated`` (-P) keeps the cwd off sys.path."""
    cmd = [sys.executable, *(["-P"] if isolated else []), "-m", "nnwatch", "check", *args]
    return subprocess.run(
        cmd, cwd=cwd or tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )


def test_healthy_factory_prints_the_report_and_exits_zero(tmp_path):
    out = _nnwatch(tmp_path, f"{FACTORIES}:healthy", "--lr-steps", "60")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[nnwatch check] model=Net (26.1K params)"
    names = ["Initial loss", "Single-batch", "Gradient norm", "LR range", "Batch"]
    assert [line[2:20].rstrip() for line in lines[1:6]] == names
    assert lines[6] == "checks: 5 passed, 0 failed"
    assert "smoothed loss against learning rate" in out.stdout  # the curve is drawn
    assert "first samples beside their labels" in out.stdout  # the decoder is used


def test_broken_factory_exits_non_zero_and_json_is_machine_readable(tmp_path):
    out = _nnwatch(
        tmp_path,
        f"{FACTORIES}:double_softmax",
        "--json",
        "--lr-steps",
        "40",
        "--overfit-steps",
        "60",
    )
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert data["ok"] is False and data["model"] == "Net"
    by_name = {c["check"]: c for c in data["checks"]}
    assert by_name["Initial loss"]["verdict"] == "SOFTMAX TWICE"
    assert by_name["Single-batch"]["passed"] is False
    assert any("softmax" in c for c in by_name["Single-batch"]["causes"])
    assert data["failed"] >= 2


def test_factory_next_to_the_user_is_found_from_the_current_directory(tmp_path):
    if sys.version_info < (3, 11):
        pytest.skip("python -P (no implicit cwd on sys.path) needs Python 3.11")
    (tmp_path / "mytrain.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def make():
                torch.manual_seed(0)
                x = torch.randn(32, 5)
                y = (x[:, 0] > 0).long()
                model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
                return model, nn.CrossEntropyLoss(), (x, y)
            """
        )
    )
    out = _nnwatch(tmp_path, "mytrain:make", "--brief", "--skip", "lr_range", isolated=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[0] == "[nnwatch check] model=Sequential (130 params)"
    assert out.stdout.splitlines()[-1] == "checks: 4 passed, 0 failed"


def test_missing_module_is_a_clear_error(tmp_path):
    out = _nnwatch(tmp_path, "no_such_module:factory")
    assert out.returncode == 2
    assert "cannot find module 'no_such_module'" in out.stderr
    assert "Traceback" not in out.stderr


def test_wrong_return_type_is_a_clear_error(tmp_path):
    out = _nnwatch(tmp_path, f"{FACTORIES}:returns_wrong_type")
    assert out.returncode == 2
    assert "returned int; return a dict with keys model, loss_fn, batch" in out.stderr
    assert "Traceback" not in out.stderr


# ----------------------------------------------------------------------------------------------
# the remaining refusals, in process (same code path, without paying for a new interpreter)


def _in_process(target: str, monkeypatch, capsys, *extra: str) -> tuple[int, str, str]:
    from nnwatch.cli import check

    monkeypatch.setattr(sys, "path", [*sys.path, str(REPO)])
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    rc = check.run(parser.parse_args([target, *extra]))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon_here", "expected MODULE:FACTORY"),
        (f"{FACTORIES}:nope", "has no 'nope'; callables it defines:"),
        (f"{FACTORIES}:NUM_CLASSES", "is a int, not a function"),
        (f"{FACTORIES}:missing_keys", "returned a dict without loss_fn"),
        (f"{FACTORIES}:not_a_module", "'model' must be a torch.nn.Module, got str"),
        (f"{FACTORIES}:raises", "raised RuntimeError: factory exploded on purpose"),
        (f"{FACTORIES}:needs_argument", "must take no arguments"),
    ],
)
def test_bad_factories_are_refused_in_plain_words(target, message, monkeypatch, capsys):
    rc, out, err = _in_process(target, monkeypatch, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("nnwatch check: error: ")
    assert message in err


def test_unknown_skip_name_is_refused(monkeypatch, capsys):
    rc, _, err = _in_process(f"{FACTORIES}:healthy", monkeypatch, capsys, "--skip", "speed")
    assert rc == 2 and "unknown check speed" in err
