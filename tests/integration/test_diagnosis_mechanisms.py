"""Diagnosis by mechanism, on real training runs: what each update did is recorded, and findings
name the mechanism the records show (issue 41).

Each test reproduces one defect seen on runs written apart from the detectors: a stall whose cause
lives in the update, a loss that moves for a reason, a number past float32's range, the words of a
finding, and nothing but nnwatch's own lines on the user's stderr.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pathologies import CASES, run_case  # noqa: E402

import nnwatch  # noqa: E402

_CASES = {c.name: c for c in CASES}


@pytest.fixture(autouse=True)
def _private_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path / "runs"))
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _warnings(name: str) -> list[Any]:
    out = run_case(_CASES[name])
    assert out.error is None, out.error
    return [f for f in out.findings if f.severity != "info"]


def _one(findings: list[Any], kind: str) -> Any:
    hits = [f for f in findings if f.kind == kind]
    assert hits, f"no {kind} among {[(f.kind, f.summary) for f in findings]}"
    return hits[0]


# ------------------------------------------------------------------------------------------------
# what is recorded


def test_each_measured_update_is_recorded_per_layer_and_for_the_run():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    truth = []  # each step's update norm, computed here
    with nnwatch.watch(model, opt, num_classes=4, name="updates", layer_interval=5, budget=None) as w:
        for _ in range(30):
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            moved = zip(model.parameters(), before, strict=True)
            truth.append(math.sqrt(sum(float((p.detach() - b).square().sum()) for p, b in moved)))
            w.step(loss, batch=(x, y))
    run = nnwatch.load_run(w.run_dir)
    assert run.meta.schema.version >= 4
    measured = run["layer_sums"] == 1.0
    assert measured.sum() >= 10 and np.all(run["update_frozen"][measured] == 0.0)
    assert np.all(run["params_no_grad"][measured] == 0.0)
    assert np.all(run["params_unoptimized"][measured] == 0.0)
    # each logged update (the statistics steps), summed over the layers, against the weights'
    # change computed here
    logged = [(s, u) for s, u in zip(run.layers["step"], run.layers["update_layer"], strict=True)]
    assert len(logged) >= 3
    for step, upd in logged:
        norm = math.sqrt(float(np.sum(upd.astype(np.float64) ** 2)))
        assert norm == pytest.approx(truth[int(step)], rel=1e-4)
    steps, ratio = run.update_ratio("0")
    assert len(steps) >= 3 and np.all((ratio > 1e-5) & (ratio < 1))
    entropy = run["label_entropy"][measured]
    assert np.all((entropy > 0.5 * math.log(4)) & (entropy <= math.log(4) + 1e-9))


def test_parameters_without_a_gradient_and_outside_the_optimizer_are_counted():
    """A head replaced after the optimizer was built: the old head is in the optimizer and never
    gets a gradient; the new one gets gradients and is in no group."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model[2] = nn.Linear(32, 4)  # BUG: the optimizer holds the old head
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    with nnwatch.watch(model, opt, num_classes=4, name="stale-head") as w:
        for _ in range(20):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
    run = nnwatch.load_run(w.run_dir)
    m = run["layer_sums"] == 1.0
    old_head = 32 * 4 + 4
    assert run["params_no_grad"][m][-1] == pytest.approx(old_head / (16 * 32 + 32 + old_head))
    assert run["params_unoptimized"][m][-1] == pytest.approx(old_head / (16 * 32 + 32 + old_head))


# ------------------------------------------------------------------------------------------------
# stalls whose cause is in the update


def test_updates_that_round_away_in_bfloat16_are_named():
    f = _one(_warnings("mech_bf16_rounding"), "loss_stalled")
    assert f.severity == "warning" and "round" in f.summary and "half precision" in f.summary
    assert f.evidence["unchanged_share"] >= 0.25
    assert "float32" in f.remedy


def test_a_decay_that_pins_the_weights_is_named_with_its_value():
    f = _one(_warnings("mech_decay_pinned"), "loss_stalled")
    assert "weight_decay=5" in f.summary and "shrank" in f.summary
    assert f.evidence["weight_norm_now"] <= 0.5 * f.evidence["weight_norm_start"]


def test_a_target_broadcast_against_the_prediction_is_named():
    f = _one(_warnings("mech_target_broadcast"), "loss_stalled")
    assert "broadcast" in f.summary and "(64, 64)" in f.summary
    assert "same shape" in f.remedy


def test_a_regression_stuck_high_at_a_far_too_high_lr_names_the_lr():
    f = _one(_warnings("mech_lr_far_too_high"), "loss_stalled")
    assert "far too high" in f.summary and "(3)" in f.summary
    assert f.evidence["update_to_weight_ratio"] >= 0.3 and f.evidence["lr"] == 3.0


def test_a_layer_rebuilt_from_data_gets_no_gradient_and_is_named():
    f = _one(_warnings("mech_data_rebuild"), "zero_gradient_layer")
    assert f.layer == "0" and "no gradient" in f.summary and ".data" in f.remedy


def test_data_in_label_order_is_seen_in_the_batches():
    f = _one(_warnings("mech_sorted_labels"), "oscillating_loss")
    assert "order of their labels" in f.summary and "shuffle" in f.remedy


def test_a_loss_that_falls_without_bound_is_named_not_called_an_explosion():
    found = _warnings("mech_kl_sign")
    f = _one(found, "loss_diverging")
    assert "falls without bound below zero" in f.summary and "sign" in f.remedy
    assert not [g for g in found if g.kind == "exploding_gradients"]


# ------------------------------------------------------------------------------------------------
# healthy runs whose loss or gradients move for a reason


def test_a_loss_detached_from_the_models_output_is_named():
    f = _one(_warnings("mech_detached_loss"), "loss_stalled")
    assert "never reaches the model's output" in f.summary
    assert "from the model's output tensor itself" in f.remedy


def test_data_read_block_by_block_is_named_from_its_periodic_jumps():
    f = _one(_warnings("mech_data_blocks"), "loss_spike")
    assert "fixed period" in f.summary and f.evidence["period_steps"] % 32 == 0
    assert "shuffle" in f.remedy


def test_a_loss_that_squashes_an_output_twice_is_named():
    f = _one(_warnings("mech_double_softmax"), "loss_stalled")
    assert "cross-entropy applies its own log-softmax" in f.summary and "a softmax" in f.summary
    assert "remove the model's last Sigmoid/Softmax" in f.remedy


@pytest.mark.parametrize(
    "name",
    [
        "healthy_curriculum", "healthy_distillation", "healthy_rare_experts",
        "healthy_gan_generator_alone", "healthy_float64_huge_loss", "healthy_sigmoid_bce",
        "healthy_logits_and_features", "healthy_fixed_order",
    ],
)  # fmt: skip
def test_a_loss_that_moves_for_a_reason_gets_no_warning(name):
    assert _warnings(name) == []


def test_a_jump_with_new_data_is_a_note_that_names_what_data_does():
    out = run_case(_CASES["healthy_curriculum"])
    notes = [f for f in out.findings if f.kind in ("exploding_gradients", "loss_diverging")]
    assert notes and all(f.severity == "info" for f in notes)
    assert any("curriculum" in f.summary for f in notes)


# ------------------------------------------------------------------------------------------------
# every number as it was


def _float64_run(big: float, steps: int = 12) -> Any:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    with torch.no_grad():
        model[2].weight.mul_(big)
    opt = torch.optim.SGD(model.parameters(), lr=1e-60)
    x = torch.randn(32, 8, dtype=torch.float64)
    losses = []
    with nnwatch.watch(model, opt, name="f64") as w:
        for _ in range(steps):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            w.step(loss, batch=(x,))
    return w, losses


def test_a_float64_loss_past_float32s_range_reads_as_it_was():
    w, losses = _float64_run(1e21)
    run = nnwatch.load_run(w.run_dir)
    assert np.array_equal(run["loss"], np.array(losses))  # bit for bit, float64
    assert all(1e38 < v < 1e44 for v in losses) and np.isfinite(run["grad_norm"]).all()
    # finite float64 activations of ~1e21 and a loss of ~1e41: nothing is called non-finite
    assert not [f for f in w.findings if f.kind == "nan_or_inf"]


def test_float64_losses_up_to_1e299_are_stored_and_worded_as_they_are():
    w, losses = _float64_run(1e150, steps=6)
    run = nnwatch.load_run(w.run_dir)
    assert np.array_equal(run["loss"], np.array(losses)) and max(losses) > 1e299
    assert not any("3.4e+38" in f.message or "3.40e+38" in f.message for f in w.findings)


def test_an_overflowed_float32_norm_is_an_overflow_with_the_largest_element():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-30)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    with nnwatch.watch(model, opt, num_classes=4, name="overflow") as w:
        for step in range(14):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y) * (1e20 if step >= 10 else 1.0)
            loss.backward()
            largest = max(float(p.grad.abs().max()) for p in model.parameters())
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            w.step(loss, batch=(x, y))
            if step == 10:
                assert math.isinf(float(total)) and math.isfinite(largest)
                first_largest = largest
    f = _one(w.findings, "nan_or_inf")
    assert "overflowed float32" in f.summary and "every gradient element is finite" in f.summary
    assert "first non-finite gradient" not in f.summary
    assert f.evidence["largest_grad_element"] == pytest.approx(first_largest, rel=1e-6)


def test_the_first_loss_is_judged_against_ln_k_only_for_a_plain_cross_entropy():
    assert not [f for f in _warnings("healthy_distillation") if f.kind == "bad_initial_loss"]
    torch.manual_seed(4)
    model = nn.Linear(16, 10)
    with torch.no_grad():
        model.weight.mul_(40.0)  # logits of std ~40: a bad init, and a plain cross-entropy
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 16), torch.randint(0, 10, (64,))
    with nnwatch.watch(model, opt, num_classes=10, name="ce") as w:
        for _ in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)  # still cross-entropy
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
    assert [f.kind for f in w.findings if f.severity != "info"] == ["bad_initial_loss"]


def test_a_rise_from_the_first_loss_is_worded_as_the_first_loss():
    torch.manual_seed(5)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=2.0)  # a ten-fold runaway in the first steps
    x, y = torch.randn(64, 16), torch.randn(64)
    with nnwatch.watch(model, opt, name="runaway") as w:
        for _ in range(12):
            opt.zero_grad()
            loss = F.mse_loss(model(x).squeeze(-1), y)
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
    f = _one(w.findings, "loss_diverging")
    first = nnwatch.load_run(w.run_dir)["loss"][0]
    assert f"its first loss ({nnwatch.store.finding.fmt(first)})" in f.summary


def test_an_overflowing_run_prints_nothing_but_nnwatchs_own_lines(tmp_path, subprocess_env):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.nn.functional as F, nnwatch
        torch.manual_seed(0)
        dtype = torch.float64 if sys.argv[1] == "64" else torch.float32
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        x, y = torch.randn(32, 8, dtype=dtype), torch.randint(0, 4, (32,))
        cap = 60 if dtype == torch.float32 else 300
        with nnwatch.watch(m, opt, num_classes=4) as w:
            for s in range(90):
                opt.zero_grad()
                loss = F.cross_entropy(m(x), y) * 10.0 ** min(s, cap)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1e30)
                opt.step()
                w.step(loss, batch=(x, y))
    """))
    for bits in ("32", "64"):
        out = subprocess.run(
            [sys.executable, str(script), bits], env=subprocess_env, capture_output=True,
            text=True, timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        foreign = [line for line in out.stderr.splitlines() if line and not line.startswith("nnwatch:")]
        assert foreign == [], foreign
