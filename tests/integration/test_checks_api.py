"""run_all and the report: the whole checklist through the Python API, on copies, repeatably."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from nnwatch.checks import CHECK_NAMES, CheckCrashed, run_all  # noqa: E402
from tests.fixtures import check_factories as F  # noqa: E402

NAMES = ["Initial loss", "Single-batch", "Gradient norm", "LR range", "Batch"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread, and a busy 2-core box makes extra threads thrash."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(spec, **kw):
    return run_all(
        spec["model"],
        spec["loss_fn"],
        spec["batch"],
        num_classes=spec.get("num_classes"),
        loader=spec.get("loader"),
        decode=spec.get("decode"),
        optimizer=spec.get("optimizer"),
        **kw,
    )


def test_healthy_report_has_the_documented_shape():
    report = _run(F.healthy())
    assert report.ok and report.exit_code == 0
    assert [r.passed for r in report.results] == [True] * 5
    lines = report.format_text().splitlines()
    assert lines[0] == "[nnwatch check] model=Net (26.1K params)"
    for line, name in zip(lines[1:6], NAMES, strict=True):
        assert re.match(rf"^  {re.escape(name)} +\S.*  \S+", line), line
        assert line[2:20].rstrip() == name  # names in an 18-wide column
    assert lines[1].endswith("OK") and "expected ln(10) = 2.3026" in lines[1]
    assert re.search(r"step \d+: loss 0\.00\d\d, acc 100\.0% +PASSED$", lines[2])
    assert re.search(r"-> \d\.\d{4} \(max_norm 1\.0\), cosine 1\.0000 +HEALTHY$", lines[3])
    assert re.search(r"suggested \d\.\de-\d \(diverges above [\d.]+\) +OK$", lines[4])
    assert re.search(r"inputs mean -?\d\.\d\d std \d\.\d\d; 10 classes balanced +OK$", lines[5])
    assert lines[6] == "checks: 5 passed, 0 failed"
    assert "smoothed loss against learning rate" in report.format_text()
    assert report.format_text(details=False).splitlines()[-1] == lines[6]


def test_broken_model_fails_the_right_checks():
    report = _run(F.unnormalized())
    assert not report.ok and report.exit_code == 1
    verdicts = {n: report.get(n).verdict for n in NAMES}
    assert verdicts["Initial loss"] == "TOO HIGH"
    assert verdicts["Gradient norm"] == "EXPLODING: clipping recommended"
    assert verdicts["Batch"] == "NOT NORMALIZED"
    assert report.counts_line() == f"checks: {report.passed_count} passed, 3 failed"


def test_checks_never_touch_the_users_model_optimizer_or_rng():
    spec = F.missing_params()
    model, opt = spec["model"], spec["optimizer"]
    before = copy.deepcopy(model.state_dict())
    groups_before = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    rng_before = torch.get_rng_state()
    report = _run(spec)
    assert report.get("Single-batch").not_in_optimizer == ["head.weight", "head.bias"]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert opt.state == {}
    assert [
        {k: v for k, v in g.items() if k != "params"} for g in opt.param_groups
    ] == groups_before
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert model.training  # mode unchanged too


def test_same_seed_same_report_and_json_is_strict():
    a = _run(F.healthy(), seed=5).to_dict()
    b = _run(F.healthy(), seed=5).to_dict()
    assert a == b
    text = json.dumps(a, allow_nan=False)
    back = json.loads(text)
    assert back["ok"] is True and [c["check"] for c in back["checks"]] == NAMES
    assert back["checks"][3]["suggestion"] == a["checks"][3]["suggestion"]


def test_json_survives_non_finite_numbers():
    spec = F.healthy()
    with torch.no_grad():
        spec["model"].head.weight[0, 0] = float("nan")
    report = _run(spec, skip=["lr_range"])
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["checks"][0]["verdict"] == "NON-FINITE"
    assert data["checks"][0]["measured"] is None  # NaN becomes null


def test_a_crashing_check_is_a_failed_line_not_a_crash():
    def bad_loss(out, y):
        raise RuntimeError("shape trouble")

    x, y = F.digits(32)
    report = run_all(F.Net(), bad_loss, (x, y))
    crashed = [r for r in report.results if isinstance(r, CheckCrashed)]
    assert [r.name for r in crashed] == ["Initial loss", "Gradient norm", "LR range"]
    assert all(r.verdict == "ERROR" for r in crashed)
    assert "RuntimeError: shape trouble" in crashed[0].causes[0]
    # the overfit check runs the step itself and reports the error as its failure cause
    overfit = report.get("Single-batch")
    assert not overfit.passed and "shape trouble" in overfit.causes[0]
    assert report.get("Batch").passed
    assert report.exit_code == 1


def test_skip_and_unknown_names():
    report = _run(F.healthy(), skip=["lr_range", "single_batch"])
    assert [r.check_name for r in report.results] == ["Initial loss", "Gradient norm", "Batch"]
    with pytest.raises(ValueError, match="unknown check"):
        _run(F.healthy(), skip=["nope"])
    assert set(CHECK_NAMES) == {"initial_loss", "single_batch", "gradient", "lr_range", "batch"}


def test_tuple_spec_and_no_loader():
    model, loss_fn, batch = F.healthy_tuple()
    report = run_all(model, loss_fn, batch)
    assert report.ok
    assert report.get("LR range").suggestion is not None


def test_regression_report_skips_ln_k():
    spec = F.healthy_regression()
    report = run_all(spec["model"], spec["loss_fn"], spec["batch"])
    assert report.get("Initial loss").skipped
    assert report.skipped_count == 1 and report.counts_line().endswith(", 1 skipped")


def test_check_modules_stay_headless():
    code = (
        "import sys, nnwatch.tensors.torch_clip, nnwatch.checks, nnwatch.cli.check\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "print(bad)\n"
        "raise SystemExit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_module_output_is_deterministic_across_dropout_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 10))
    x, y = F.digits(64)
    a = run_all(model, nn.CrossEntropyLoss(), (x, y), skip=["lr_range"]).to_dict()
    b = run_all(model, nn.CrossEntropyLoss(), (x, y), skip=["lr_range"]).to_dict()
    assert a == b
    assert a["checks"][1]["passed"]  # dropout is off in the overfit test


def test_checks_work_on_a_model_under_the_live_probe():
    """A watched model carries probe hooks: the copies drop them, the original keeps them."""
    import nnwatch

    spec = F.healthy()
    model = spec["model"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    w = nnwatch.watch(model, opt)
    try:
        hooks = [
            (list(m._forward_hooks.items()), list(m._forward_pre_hooks.items()))
            for m in model.modules()
        ]
        report = _run(spec, skip=["lr_range"])
        assert report.ok, report.format_text()
        assert w.step_index == 0  # the checks' passes were not recorded as training steps
        assert hooks == [
            (list(m._forward_hooks.items()), list(m._forward_pre_hooks.items()))
            for m in model.modules()
        ]
        x, y = spec["batch"]
        opt.zero_grad()
        loss = spec["loss_fn"](model(x), y)
        loss.backward()
        opt.step()
        w.step(loss)
        assert w.step_index == 1  # the probe still works on the original
    finally:
        w.close()
