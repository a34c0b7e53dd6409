"""Detectors, hysteresis and robust statistics on hand-built step records.

The records use the run's real structured dtype (``RunSchema.record_dtype()``) and go through the
same :class:`Pipeline` the live probe uses; only the numbers are chosen by the test, so each rule
can be pushed exactly across (and kept just short of) its threshold.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnwatch.diagnosis import Finding
from nnwatch.diagnosis.context import RunContext
from nnwatch.diagnosis.episode import Episode, EpisodeArray
from nnwatch.diagnosis.history import linear_fit, median, median_sigma, quantile
from nnwatch.diagnosis.offline import diagnose_run
from nnwatch.diagnosis.pipeline import Pipeline
from nnwatch.store.schema import RunMeta, RunSchema

LAYERS = ("fc1", "act1", "fc2", "act2", "head")
KINDS = ("Linear", "ReLU", "Linear", "ReLU", "Linear")
PARAMS = ("fc1", "fc2", "head")


def meta(num_classes: int | None = None) -> RunMeta:
    schema = RunSchema(LAYERS, KINDS, PARAMS, num_lr=1)
    return RunMeta(name="t", schema=schema, pid=1, host="h", started=0.0, num_classes=num_classes)


def records(n: int, *, loss=2.0, grad=1.0, lr=0.1, seed: int = 0) -> np.ndarray:
    """``n`` healthy-looking records: per-layer sums finite, stats sampled every 10 steps."""
    rng = np.random.default_rng(seed)
    dt = meta().schema.record_dtype()
    r = np.zeros(n, dtype=dt)
    for name in dt.names:
        r[name] = np.nan
    r["step"] = np.arange(n)
    r["loss"] = loss
    r["grad_norm"] = grad
    r["lr"] = np.reshape(lr, (-1, 1)) if np.ndim(lr) else lr
    r["act_sum"] = rng.uniform(1, 2, size=(n, len(LAYERS)))
    r["grad_layer"] = (
        np.asarray(grad) * 0.5
        if np.ndim(grad) == 0
        else np.repeat(np.asarray(grad)[:, None] * 0.5, len(PARAMS), 1)
    )
    sampled = r["step"] % 10 == 0
    r["layer_stats"] = np.where(sampled, 1.0, 0.0)
    r["act_zero"][sampled] = [0.0, 0.5, 0.0, 0.5, 0.0]
    r["act_dead"][sampled] = [np.nan, 0.05, np.nan, 0.05, np.nan]  # rectifiers only
    r["act_std"][sampled] = 1.0
    r["act_nonfinite"][sampled] = 0.0
    return r


def run(rows: np.ndarray, num_classes: int | None = None, **ctx) -> list[Finding]:
    c = RunContext.from_meta(meta(num_classes))
    if ctx:
        from dataclasses import replace

        c = replace(c, **ctx)
    return Pipeline(c).feed(rows)


def kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


# ------------------------------------------------------------------------------------------------
# findings, hysteresis, statistics


def test_finding_is_json_safe_and_round_trips():
    f = Finding(
        kind="exploding_gradients",
        severity="error",
        step=12,
        summary="norm went up.",
        remedy="clip at 3",
        layer="fc1",
        evidence={"grad_norm": math.inf, "loss": math.nan, "ratio": 12.5},
    )
    d = json.loads(json.dumps(f.to_dict(), allow_nan=False))
    assert d["evidence"] == {"grad_norm": "inf", "loss": None, "ratio": 12.5}
    assert "Fix: clip at 3" in d["message"] and "in `fc1`" in d["message"]
    back = Finding.from_dict(d)
    assert back.kind == f.kind and back.step == 12 and back.layer == "fc1"
    assert math.isinf(back.evidence["grad_norm"]) and math.isnan(back.evidence["loss"])
    with pytest.raises(ValueError):
        Finding(kind="x", severity="fatal", step=0, summary="", remedy="")


def test_episode_reports_once_per_episode_and_rearms_after_release():
    ep = Episode(confirm=2, release=3)
    opened = [ep.update(h, i) for i, h in enumerate([1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1, 1])]
    assert [i for i, o in enumerate(opened) if o] == [3, 11]  # flicker inside the episode: silent
    arr = EpisodeArray(3, confirm=1, release=2)
    a = arr.update(np.array([True, False, False]), 0)
    b = arr.update(np.array([True, True, False]), 1)
    assert a.tolist() == [True, False, False] and b.tolist() == [False, True, False]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60), st.floats(0, 1))
def test_fast_median_and_quantile_agree_with_numpy(xs, q):
    assert median(xs) == pytest.approx(float(np.median(xs)), rel=1e-12, abs=1e-9)
    assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-9, abs=1e-6)


def test_linear_fit_and_robust_spread():
    x = 3.0 + 0.5 * np.arange(40) + np.random.default_rng(1).normal(0, 0.1, 40)
    slope, icpt, se = linear_fit(x)
    ps, pi = np.polyfit(np.arange(40), x, 1)
    assert slope == pytest.approx(ps) and icpt == pytest.approx(pi) and 0 < se < 0.01
    med, sig = median_sigma(np.array([1.0, 1.1, 0.9, 1.0, 1000.0, np.nan]))
    assert med == pytest.approx(1.0) and sig < 0.2  # the outlier barely moves either


# ------------------------------------------------------------------------------------------------
# exploding gradients


def test_large_but_stable_grad_norm_is_not_exploding():
    rng = np.random.default_rng(2)
    grad = 5000.0 * np.exp(rng.normal(0, 0.3, 400))  # ~5000, noisy, stable
    assert run(records(400, grad=grad, loss=np.linspace(10.0, 5.0, 400))) == []


def test_jump_with_worsening_loss_is_one_exploding_finding():
    n = 200
    grad = np.ones(n)
    grad[120:] = 200.0  # 200x, and it stays there
    loss = np.full(n, 1.0)
    loss[120:] = 5.0
    found = run(records(n, grad=grad, loss=loss))
    ex = [f for f in found if f.kind == "exploding_gradients"]
    assert len(ex) == 1  # one per episode
    f = ex[0]
    assert f.step == 121 and f.evidence["times_usual"] >= 100
    assert "clip gradients at 2" in f.remedy and "lower the LR" in f.remedy


def test_growing_norm_with_falling_loss_is_a_model_waking_up_not_an_explosion():
    n = 200
    grad = np.geomspace(0.01, 10.0, n)  # 1000x growth
    loss = np.linspace(2.3, 0.5, n)
    assert "exploding_gradients" not in kinds(run(records(n, grad=grad, loss=loss)))


# ------------------------------------------------------------------------------------------------
# vanishing gradients, dead ReLU


def test_first_to_last_ratio_names_the_starved_layer():
    r = records(30, grad=1.0)
    r["grad_layer"] = [1e-9, 1e-5, 1.0]  # fc1, fc2, head
    numel = np.array([100.0, 100.0, 100.0])
    found = run(r, param_numel=numel)
    v = [f for f in found if f.kind == "vanishing_gradients"]
    assert len(v) == 1 and v[0].layer == "fc1" and v[0].step == 2  # confirmed on the 3rd step
    assert v[0].evidence["first_to_last_layer_ratio"] == pytest.approx(1e-9)


def test_dead_relu_from_exact_zero_sums_and_from_sampled_dead_units():
    r = records(40)
    r["act_sum"][:, 3] = 0.0  # act2: every output zero, every step
    found = [f for f in run(r) if f.kind == "dead_relu"]
    assert len(found) == 1 and found[0].layer == "act2" and found[0].step == 2
    assert found[0].severity == "error" and found[0].evidence["all_outputs_zero"] == 1.0

    r = records(60)
    r["act_dead"][r["layer_stats"] == 1.0] = [0.99, 0.05, 0.99, 0.05, 0.0]  # only Linear layers
    assert "dead_relu" not in kinds(run(r))  # a Linear has no dead units to speak of
    r = records(60)
    sampled = np.flatnonzero(r["layer_stats"] == 1.0)
    r["act_dead"][sampled[2:]] = [np.nan, 0.8, np.nan, 0.05, np.nan]  # act1: 5% -> 80%, two samples
    f = [f for f in run(r) if f.kind == "dead_relu"]
    assert len(f) == 1 and f[0].layer == "act1" and f[0].step == 30 and f[0].severity == "warning"
    assert f[0].evidence["dead_unit_fraction"] == pytest.approx(0.8)


def test_a_sparse_relu_layer_with_few_dead_units_is_healthy():
    """Issue: healthy sparse layers sit at 75-84% zeros with only 6-15% of their units dead."""
    r = records(200)
    s = r["layer_stats"] == 1.0
    r["act_zero"][s] = [0.0, 0.84, 0.0, 0.78, 0.0]
    r["act_dead"][s] = [np.nan, 0.15, np.nan, 0.06, np.nan]
    assert "dead_relu" not in kinds(run(r))


def test_nan_zero_fractions_are_not_dead_units():
    r = records(40)
    s = r["layer_stats"] == 1.0
    r["act_zero"][s] = 1.0  # what the probe reports for all-NaN outputs ...
    r["act_dead"][s] = [np.nan, 1.0, np.nan, 1.0, np.nan]
    r["act_nonfinite"][s] = 64.0  # ... together with the NaN count
    assert "dead_relu" not in kinds(run(r))


# ------------------------------------------------------------------------------------------------
# NaN / Inf origin


def test_nan_origin_forward_and_backward():
    r = records(20)
    r["act_sum"][12, 2:] = np.nan  # fc2 and everything after it
    r["grad_layer"][12] = [np.inf, np.inf, 0.3]
    r["loss"][12] = np.nan
    f = [f for f in run(r) if f.kind == "nan_or_inf"]
    assert len(f) == 1 and f[0].step == 12 and f[0].layer == "fc2" and f[0].severity == "critical"
    assert "first non-finite output in fc2 (Linear)" in f[0].summary
    assert "first non-finite gradient in fc2" in f[0].summary  # output side first: fc2, not fc1
    assert f[0].evidence["forward_layer_index"] == 2


def test_nan_in_loss_only_points_at_the_loss_computation():
    r = records(20)
    r["loss"][15:] = np.nan
    r["nonfinite_grads"][15:] = 1.0
    r["grad_layer"][15:] = np.inf
    f = [f for f in run(r) if f.kind == "nan_or_inf"]
    assert len(f) == 1 and f[0].step == 15
    assert "loss computation" in f[0].summary and "epsilon to the log" in f[0].remedy


# ------------------------------------------------------------------------------------------------
# AMP, initial loss, stall, oscillation


def amp_records(scales: list[float], init: float = 65536.0) -> np.ndarray:
    r = records(len(scales), loss=np.linspace(2.0, 1.0, len(scales)))
    r["amp_scale"] = scales
    prev = np.concatenate(([init], scales[:-1]))
    r["amp_skipped"] = (np.asarray(scales) < prev).astype(float)
    return r


def test_amp_calibration_is_healthy_but_repeated_halving_is_collapse():
    calib = [65536.0 / 2**k for k in range(1, 9)] + [256.0] * 60
    assert run(amp_records(calib)) == []
    # issue: a scaler started at 2^32 halves 14 times through its calibration, then trains at
    # 2.6e5: no collapse (the old rule fired at step 11)
    big = [2.0**32 / 2**k for k in range(1, 15)] + [2.0**18] * 80
    assert run(amp_records(big, init=2.0**32)) == []
    # every step skipped from the start until the scale is below 1: collapse, at the floor
    floor = [65536.0 / 2**k for k in range(1, 20)]
    f = [f for f in run(amp_records(floor)) if f.kind == "amp_scale_collapse"]
    assert len(f) == 1 and f[0].evidence["scale"] < 1.0
    collapse = [1024.0] * 30 + [1024.0 / 2**k for k in range(1, 12)]
    f = [f for f in run(amp_records(collapse)) if f.kind == "amp_scale_collapse"]
    assert len(f) == 1 and f[0].step == 33 and f[0].evidence["skipped_in_a_row"] == 4


@pytest.mark.parametrize(
    ("loss0", "k", "expect"),
    [(23.0, 10, True), (2.4, 10, False), (0.9, 10, True), (0.70, 10, False), (23.0, None, False)],
)
def test_initial_loss_against_ln_k(loss0, k, expect):
    r = records(10, loss=np.linspace(loss0, loss0 * 0.9, 10))
    r["samples_per_sec"], r["step_time"] = 640.0, 0.1  # batch of 64
    f = [f for f in run(r, num_classes=k) if f.kind == "bad_initial_loss"]
    assert bool(f) == expect
    if f:
        assert f[0].step == 0 and f[0].evidence["expected_ln_k"] == pytest.approx(math.log(k))


@pytest.mark.parametrize(("micro", "expect"), [(1, True), (4, False), (8, True)])
def test_initial_loss_divided_for_accumulation_is_not_a_leak(micro, expect):
    """ln(10)/4 is what an accumulation loop over 4 micro-batches hands w.step() at the start."""
    r = records(10, loss=np.full(10, math.log(10) / 4))
    f = [f for f in run(r, num_classes=10, micro_batches=micro) if f.kind == "bad_initial_loss"]
    assert bool(f) == expect
    if f and micro > 1:
        assert f"with {micro} micro-batches per update" in f[0].remedy


def test_summed_loss_is_recognised_from_the_batch_size():
    r = records(10, loss=64 * math.log(10))
    r["samples_per_sec"], r["step_time"] = 640.0, 0.1
    (f,) = [f for f in run(r, num_classes=10) if f.kind == "bad_initial_loss"]
    assert "reduction='mean'" in f.remedy


def test_zero_lr_for_five_steps_is_a_stall_with_its_cause():
    lr = np.full(80, 0.1)
    lr[50:] = 0.0
    f = [f for f in run(records(80, lr=lr, loss=np.linspace(2, 1, 80))) if f.kind == "loss_stalled"]
    assert len(f) == 1 and f[0].step == 54 and "LR has been exactly 0" in f[0].summary


@pytest.mark.parametrize(
    ("level", "k", "severity"),
    [
        (2.30, 10, "info"),  # at chance for 120 steps, no cause seen: a plateau may still drop
        (0.9, None, "info"),  # a flat loss of unknown meaning (regression, GAN): a note only
        (0.02, 10, None),  # converged
        (1e-5, None, None),
        (5e-4, None, "info"),
    ],
)
def test_a_flat_loss_is_a_note_a_warning_only_when_long_at_chance(level, k, severity):
    rng = np.random.default_rng(5)
    loss = level * (1 + rng.normal(0, 0.01, 120))  # flat from the start: nothing learned
    found = [f for f in run(records(120, loss=loss), num_classes=k) if f.kind == "loss_stalled"]
    if severity is None:
        assert found == []
        return
    assert found[0].severity == "info" and "not yet a warning" in found[0].summary
    assert found[0].evidence["cause_code"] == 3 and 39 <= found[0].step <= 45
    assert [f.severity for f in found] == (
        ["info", "warning"] if severity == "warning" else ["info"]
    )
    if severity == "warning":
        assert found[1].step == 100 and "chance level" in found[1].summary


def test_a_plateau_that_drops_before_it_is_long_stays_a_note():
    rng = np.random.default_rng(6)
    n = 200
    loss = math.log(2) * (1 + rng.normal(0, 0.01, n))
    loss[70:] = np.linspace(math.log(2), 0.1, n - 70) * (1 + rng.normal(0, 0.01, n - 70))
    found = [f for f in run(records(n, loss=loss), num_classes=2) if f.kind == "loss_stalled"]
    assert [f.severity for f in found] == ["info"]


def test_noisy_but_improving_loss_raises_nothing():
    rng = np.random.default_rng(3)
    n = 600
    loss = np.linspace(2.3, 0.8, n) * np.exp(rng.normal(0, 0.4, n))  # very noisy
    grad = np.exp(rng.normal(0, 0.5, n))
    assert run(records(n, loss=loss, grad=grad)) == []


def test_zigzag_after_a_calm_phase_is_oscillation():
    rng = np.random.default_rng(4)
    n = 200
    loss = 1.0 + 0.01 * rng.normal(size=n)
    loss[100:] = 1.2 + 0.5 * (-1.0) ** np.arange(100)  # period-2 swings, no progress
    f = [f for f in run(records(n, loss=loss)) if f.kind == "oscillating_loss"]
    assert len(f) == 1 and 100 <= f[0].step <= 110
    assert f[0].evidence["times_usual"] >= 3 and "lower the LR" in f[0].remedy


def test_offline_diagnosis_of_a_recorded_run(tmp_path, monkeypatch):
    """diagnose_run re-reads scalars.bin/layers.bin and gives the same verdict as live."""
    import torch

    import nnwatch

    monkeypatch.setenv("NNWATCH_RUN_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        model[0].bias.fill_(-50.0)  # dead from the start
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = nnwatch.watch(model, opt, num_classes=3, channel=False)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for _ in range(12):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        w.step(loss)
    w.close()
    live = [(f.kind, f.step, f.layer) for f in w.findings if isinstance(f, Finding)]
    offline = [(f.kind, f.step, f.layer) for f in diagnose_run(w.run_dir)]
    assert ("dead_relu", 0, "1") in live
    assert [x for x in offline if x[0] == "dead_relu"] == [x for x in live if x[0] == "dead_relu"]


# ------------------------------------------------------------------------------------------------
# saturated activations and a run's own heavy tail

SQUASHING = ("Linear", "Tanh", "Linear", "Sigmoid", "Linear")


def squashing_records(tanh_std: float, sig_mean: float, sig_std: float, n: int = 40) -> np.ndarray:
    r = records(n)
    sampled = r["layer_stats"] == 1.0
    r["act_mean"][sampled] = [0.0, 0.0, 0.0, sig_mean, 0.0]
    r["act_std"][sampled] = [1.0, tanh_std, 1.0, sig_std, 1.0]
    r["act_zero"][sampled] = 0.0
    return r


def test_saturated_tanh_and_sigmoid_from_mean_and_std():
    # tanh: E[1 - y^2] = 1 - 0.985^2 = 0.03; sigmoid: 4 E[y(1 - y)] = 4 (0.5 - 0.25 - 0.49^2) = 0.04
    found = run(squashing_records(0.985, 0.5, 0.49), layer_kinds=SQUASHING)
    sat = [f for f in found if f.kind == "saturated_activation"]
    assert [(f.layer, f.step) for f in sat] == [("act1", 10)]  # two samples in a row
    assert sat[0].evidence["derivative_fraction"] == pytest.approx(0.03, abs=1e-3)
    assert sat[0].evidence["saturated_layers"] == 2 and "Also saturated: act2." in sat[0].summary
    assert "+-1" in sat[0].summary
    assert "normalize the inputs" in sat[0].remedy and sat[0].severity == "warning"
    sig = run(squashing_records(0.6, 0.5, 0.49), layer_kinds=SQUASHING)
    (f,) = [f for f in sig if f.kind == "saturated_activation"]
    assert f.layer == "act2" and f.evidence["derivative_fraction"] == pytest.approx(0.04, abs=1e-3)
    assert "0 and 1" in f.summary


def test_deep_saturation_is_reported_on_the_first_sample():
    sat = [
        f
        for f in run(squashing_records(0.995, 0.5, 0.2), layer_kinds=SQUASHING)
        if f.kind == "saturated_activation"
    ]
    assert [(f.layer, f.step) for f in sat] == [("act1", 0)]  # 1 - 0.995^2 = 0.01


@pytest.mark.parametrize("tanh_std", [0.6, 0.9, 0.95])
def test_working_tanh_and_sigmoid_layers_are_not_saturated(tanh_std):
    # 0.95 -> fraction 0.0975: confident, not pinned; the sigmoid at 0.5 +- 0.3 works
    found = run(squashing_records(tanh_std, 0.5, 0.3), layer_kinds=SQUASHING)
    assert "saturated_activation" not in kinds(found)


def test_the_same_outputs_on_a_relu_layer_are_not_saturation():
    found = run(squashing_records(0.985, 0.5, 0.49))  # the default kinds: ReLU, not Tanh
    assert "saturated_activation" not in kinds(found)


def test_a_jump_the_run_often_makes_is_its_tail_not_a_spike():
    rng = np.random.default_rng(7)
    n = 300
    loss = 0.01 * np.exp(rng.normal(0, 0.3, n))
    smooth = loss.copy()
    loss[[120, 170, 220]] = [0.55, 0.6, 0.5]  # a batch of two drawing a hard pair now and then
    loss[260] = 1.0
    smooth[260] = 1.0
    tail = [f.onset_step for f in run(records(n, loss=loss)) if f.kind == "loss_spike"]
    assert tail == [120, 170]  # the first jumps are news; by the third they are the run's habit
    (f,) = [f for f in run(records(n, loss=smooth)) if f.kind == "loss_spike"]
    assert f.onset_step == 260


# ------------------------------------------------------------------------------------------------
# issue 32: what a finding says agrees with the records


def test_a_loss_128x_its_start_at_step_1_diverges_within_three_steps():
    """A GCN on an unnormalised adjacency: the loss is 128x its start at step 1 and decays slowly
    from there (it was flagged only at step 112)."""
    loss = np.concatenate(([1.0], 128.0 * np.geomspace(1.0, 0.3, 59)))
    f = [f for f in run(records(60, loss=loss)) if f.kind == "loss_diverging"]
    assert f and f[0].step <= 3
    assert "from its first loss (1)" in f[0].summary


def test_divergence_names_the_level_it_compares_with():
    rng = np.random.default_rng(3)
    loss = np.concatenate((np.linspace(4.79, 1.0, 40), np.linspace(1.0, 14.0, 40)))
    loss = loss * (1 + rng.normal(0, 0.01, loss.size))
    f = [f for f in run(records(loss.size, loss=loss)) if f.kind == "loss_diverging"]
    assert f
    before = f[0].evidence["loss_before"]
    assert before < 2.0  # the run's own best level, not step 0's 4.79
    assert f"from its best level {before:.3g}" in f[0].summary or "the level it held before" in f[0].summary


def test_an_exploding_run_whose_clip_never_fired_is_not_told_the_clip_bounds_it():
    grad = np.concatenate((np.full(30, 1.0), np.geomspace(1.0, 1e6, 30)))
    loss = np.concatenate((np.linspace(2.0, 1.5, 30), np.geomspace(1.5, 500.0, 30)))
    r = records(60, grad=grad, loss=loss)
    r["clip_threshold"] = 1e9  # clipped with a threshold far above any norm
    f = [f for f in run(r) if f.kind == "exploding_gradients"]
    assert f and "never fired" in f[0].remedy and "bounds each update" not in f[0].remedy


def test_the_clip_ratio_rule_stays_quiet_while_the_loss_diverges():
    grad = np.full(80, 50.0)
    loss = np.concatenate((np.linspace(2.0, 1.0, 30), np.geomspace(1.0, 80.0, 50)))
    r = records(80, grad=grad, loss=loss)
    r["clip_threshold"] = 0.1  # fires on every step by 500x
    found = kinds(run(r))
    assert "loss_diverging" in found
    after = found[found.index("loss_diverging"):]
    assert "clipping_misuse" not in after


def test_gradients_gone_at_every_update_are_a_stall_with_that_cause():
    """zero_grad() between backward() and step(): the norm the update used is exactly 0."""
    r = records(30, loss=np.full(30, math.log(10)))
    r["grad_norm_clipped"] = 0.0
    f = [f for f in run(r, num_classes=10) if f.kind == "loss_stalled"]
    assert f and f[0].severity == "warning" and f[0].step == 4
    assert "between backward() and step()" in f[0].remedy
