"""The cost budget: what it measures on the steps it skips, and what it still catches there."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.probe.budget import AIM, UPDATE_EVERY, CostBudget
from nnwatch.probe.loss_trend import HOLD
from nnwatch.probe.watch import AFTER_TROUBLE, WARMUP_STEPS, internals
from nnwatch.store.schema import RunMeta, RunSchema, sums_measured
from nnwatch.tensors.torch_clip import global_norm


def _feed(
    b: CostBudget, light: float, full: float, sampled: float, step: float, n: int = UPDATE_EVERY,
    stats_only: float = math.nan,
) -> None:  # fmt: skip
    """One update's worth of timings, as the probe adds them (seconds per step of each kind).

    ``full``: a measured step; ``sampled``: measured with per-layer statistics; ``stats_only``:
    statistics on an unmeasured step. NaN: no step of that kind.
    """
    acc = []
    for value in (light, stats_only, full, sampled):  # the order of CostBudget.cost
        acc += [0.0, 0] if math.isnan(value) else [value * n, n]
    b.acc = acc
    b.times = [step] * n
    b.update()


def test_budget_picks_the_smallest_interval_that_fits() -> None:
    b = CostBudget(0.01, max_interval=16, layer_interval=10)
    # bare step ~50 ms: 1% is ~0.5 ms; a measurement costs 1 ms more than a light step (0.1 ms)
    _feed(b, light=100e-6, full=1.1e-3, sampled=1.1e-3, step=50e-3)
    # it aims at AIM of the budget: 0.7% of the ~48.9 ms bare step is 0.34 ms
    assert b.interval == 5  # 0.1 + 1.0 / 5 = 0.30 ms fits; 1.0 / 4 would not
    assert b.layer_interval == 10  # statistics cost nothing extra here: not stretched
    assert b.average_cost(b.interval, b.layer_interval) <= AIM * 0.01 * 50e-3


def test_the_writer_threads_cpu_counts_against_the_same_budget() -> None:
    """The run log's writer shares the trainer's GIL and cores: its CPU per record is part of
    every step's cost, so the probe measures more rarely to keep both within the fraction."""
    alone = CostBudget(0.01, max_interval=16, layer_interval=10)
    _feed(alone, light=100e-6, full=1.1e-3, sampled=1.1e-3, step=50e-3)
    shared = CostBudget(0.01, max_interval=16, layer_interval=10)
    shared.background = lambda: 100e-6  # 0.2 % of the step in the writer thread
    _feed(shared, light=100e-6, full=1.1e-3, sampled=1.1e-3, step=50e-3)
    assert alone.interval == 5
    # 0.7 % of the ~48.9 ms bare step is 0.342 ms: 0.1 + 0.1 + 1.0 / 8 = 0.325 fits, / 7 would not
    assert shared.interval == 8
    assert 100e-6 + shared.average_cost(shared.interval, shared.layer_interval) <= AIM * 0.01 * 50e-3
    broken = CostBudget(0.01, max_interval=16, layer_interval=10)
    broken.background = lambda: 1 / 0  # a failing gauge leaves the budget as it was
    _feed(broken, light=100e-6, full=1.1e-3, sampled=1.1e-3, step=50e-3)
    assert broken.interval == 5


def test_a_real_run_hands_its_writers_cpu_to_the_budget(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nnwatch.watch(model, opt, run_dir=tmp_path / "run", detectors=False) as w:
        for _ in range(5):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).square().mean()
            loss.backward()
            opt.step()
            w.step(loss)
        budget, log = internals(w).parts.schedule.budget, internals(w).files.log
        assert log is not None and budget.background == log.recent_cpu
    assert log.cpu_records == 5 and log.cpu_seconds > 0  # close() drained the last ones
    assert 0 < log.cpu_per_record() < 0.1 and 0 < log.recent_cpu() < 0.1


def test_statistics_interval_stretches_before_gradient_norms_thin_out() -> None:
    b = CostBudget(0.01, max_interval=32, layer_interval=10)
    # full statistics cost 20 ms a time: every 10 steps alone would be 4% of a 50 ms step
    _feed(b, light=100e-6, full=600e-6, sampled=20.6e-3, step=50e-3)
    assert b.layer_interval == 100
    assert b.interval == 16  # 0.1 + 0.5 / 16 + 20 / 100 = 0.331 ms of 0.332 allowed
    assert b.average_cost(b.interval, b.layer_interval) <= AIM * 0.01 * 50e-3


def test_a_step_too_cheap_to_afford_anything_measures_as_rarely_as_allowed() -> None:
    b = CostBudget(0.01, max_interval=8, layer_interval=10)
    _feed(b, light=200e-6, full=2e-3, sampled=3e-3, step=5e-3)  # the light step alone is 4%
    assert (b.interval, b.layer_interval) == (8, 100)


def test_explicit_statistics_interval_and_no_budget_are_kept() -> None:
    b = CostBudget(0.01, max_interval=16, layer_interval=4, stretch_stats=False)
    _feed(b, light=100e-6, full=600e-6, sampled=20e-3, step=50e-3)
    assert b.layer_interval == 4
    off = CostBudget(None)
    _feed(off, light=100e-6, full=1, sampled=1, step=2)
    assert (off.interval, off.layer_interval) == (1, 10)
    with pytest.raises(ValueError, match="positive fraction"):
        CostBudget(0.0)


def test_detailed_mode_pays_for_statistics_and_budgets_the_measurements() -> None:
    b = CostBudget(0.01, max_interval=16, layer_interval=1, stretch_stats=False)
    # the warm-up measures every step with statistics: all of it is charged to measuring
    _feed(b, light=math.nan, full=math.nan, sampled=2.5e-3, step=30e-3)
    assert b.layer_interval == 1
    assert b.interval == 13  # 2.5 / 13 = 0.192 ms of 0.7% of the 27.5 ms bare step (0.1925 ms)
    assert not b.measures_sampled_steps()  # statistics steps no longer imply a measurement
    # then unmeasured statistics steps show what a measurement really adds: 1 ms
    _feed(b, light=math.nan, full=math.nan, sampled=2.5e-3, step=30e-3, stats_only=1.5e-3)
    assert b.parts()[1] == pytest.approx(1e-3)
    assert b.interval == 6  # 1.0 / 6 = 0.17 ms of ~0.2 ms; 1.0 / 5 would not fit
    assert b.layer_interval == 1


def test_parts_separate_base_measurement_and_statistics() -> None:
    b = CostBudget(0.01, max_interval=16, layer_interval=10)
    _feed(b, light=100e-6, full=700e-6, sampled=1.2e-3, step=50e-3)
    assert b.parts() == pytest.approx((100e-6, 600e-6, 500e-6))
    only_measured = CostBudget(0.01)
    _feed(only_measured, light=math.nan, full=700e-6, sampled=math.nan, step=50e-3)
    assert only_measured.parts() == pytest.approx((0.0, 700e-6, 0.0))  # the costlier guess


def test_each_step_lands_in_its_own_kind() -> None:
    b = CostBudget(0.01)
    for i in range(UPDATE_EVERY):  # alternately measured only and statistics only
        b.add(1e-3 if i % 2 else 2e-3, 50e-3, measured=bool(i % 2), sampled=not i % 2)
    assert b.cost[2] == pytest.approx(1e-3) and b.cost[1] == pytest.approx(2e-3)
    assert math.isnan(b.cost[0]) and math.isnan(b.cost[3])
    assert b.step_time == pytest.approx(50e-3)


def test_a_long_gap_between_steps_does_not_buy_more_measuring() -> None:
    """A validation pass or a checkpoint between two w.step() calls is not a slow step."""
    steady, gapped = CostBudget(0.01, max_interval=32), CostBudget(0.01, max_interval=32)
    for b, gap in ((steady, 50e-3), (gapped, 60.0)):
        for update in range(3):
            for i in range(UPDATE_EVERY):
                measured = i % 4 == 0
                step = gap if (update, i) == (1, 5) else 50e-3  # one minute-long pause
                b.add(1.1e-3 if measured else 100e-6, step, measured=measured, sampled=False)
    assert gapped.step_time == pytest.approx(50e-3)
    assert gapped.interval == steady.interval == 5  # 0.1 + 1.0 / 5 ms fits 0.7% of ~50 ms


# ------------------------------------------------------------------------------------------------
# a real training loop under a budget it can never meet: it measures every 4th step only
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


def _train(
    model: nn.Module, opt: torch.optim.Optimizer, steps: int, g: torch.Generator,
    w: nnwatch.Watch | None = None, poison: bool = False,
) -> np.ndarray:  # fmt: skip
    """Train (watched when ``w`` is given); torch's own global grad norm of every step.

    ``poison``: a NaN in each of these steps' inputs.
    """
    norms = []
    for _ in range(steps):
        x = torch.randn(16, 12, generator=g)
        y = x[:, :3].argmax(dim=1)  # learnable: a healthy run
        if poison:
            x[3, 5] = float("nan")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        # torch's number, through nnwatch's bitwise copy: a call of torch's own would be seen by
        # the probe as the loop clipping, and recorded on every step
        norms.append(global_norm(list(model.parameters())))
        opt.step()
        if w is not None:
            w.step(loss, batch=(x, y))
    return torch.stack(norms).numpy()


def test_measured_steps_are_exact_and_light_steps_are_absent_not_zero() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with nnwatch.watch(model, opt, name="budget", budget=1e-9, max_interval=4, layer_interval=10) as w:
        norms = _train(model, opt, 80, torch.Generator().manual_seed(1), w)
    run = nnwatch.load_run(w.run_dir)
    measured = run["layer_sums"] == 1.0
    assert measured[:WARMUP_STEPS].all()
    late = np.arange(80) >= WARMUP_STEPS + UPDATE_EVERY
    sampled_late = (late & (np.arange(80) % 10 == 0)).sum()
    assert measured[late].sum() <= late.sum() // 4 + 1 + sampled_late  # every 4th, + sampled
    gaps = np.diff(np.flatnonzero(measured))
    assert gaps.max() <= 4  # never more than max_interval apart
    # the global norm on every step, measured or not (issue: spikes fell between measurements);
    # the per-layer norms on measured steps only, NaN elsewhere, never 0
    assert np.allclose(run["grad_norm"], norms, rtol=1e-6)
    assert (run["nonfinite_grads"] == 0.0).all()
    assert np.isnan(run.layers["grad_layer"][~measured[run.layers["step"]]]).all()
    assert np.isnan(run["loss"]).sum() == 0  # the loss, LR and timings are recorded every step
    assert np.isfinite(run["step_time"][1:]).all()
    # full statistics only on sampled steps, which are always measured ones
    assert set(run.layers["step"].tolist()) == set(range(0, 80, 10))
    assert measured[::10].all()
    # a healthy run is not mistaken for one whose gradients vanished on the unmeasured steps
    assert [f.kind for f in w.findings] == []


def test_layer_hooks_are_attached_only_for_measured_steps() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hooked = []
    with nnwatch.watch(model, opt, name="hooks", budget=1e-9, max_interval=4) as w:
        g = torch.Generator().manual_seed(1)
        for _ in range(60):
            x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
            hooked.append((len(model[0]._forward_hooks), internals(w).parts.schedule.measure))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
    assert all(n == (1 if measure else 0) for n, measure in hooked)
    assert {m for _, m in hooked} == {True, False}
    assert len(model[0]._forward_hooks) == 0  # and none after close


def test_detailed_mode_takes_statistics_every_step_and_measures_on_the_budget() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = 80
    with nnwatch.watch(model, opt, name="detailed", budget=1e-9, max_interval=4, layer_interval=1) as w:
        norms = _train(model, opt, n, torch.Generator().manual_seed(1), w)
    run = nnwatch.load_run(w.run_dir)
    # per-layer statistics on every step, as asked
    assert (run["layer_stats"] == 1.0).all()
    assert run.layers["step"].tolist() == list(range(n))
    assert np.isfinite(run.layers["act_zero"]).all() and np.isfinite(run.layers["act_std"]).all()
    # layer sums and gradient norms follow the budget: every 4th step once it has settled
    measured = run["layer_sums"] == 1.0
    late = np.arange(n) >= WARMUP_STEPS + 2 * UPDATE_EVERY
    assert 0 < measured[late].sum() <= late.sum() // 4 + 1
    assert np.diff(np.flatnonzero(measured)).max() <= 4
    # the global norm is taken on every step (a spike between measured steps is the point of a
    # monitor); the per-layer norms and sums only on measured ones
    assert np.allclose(run["grad_norm"], norms, rtol=1e-6)
    assert np.isnan(run.layers["grad_layer"][~measured]).all()
    assert np.isnan(run.layers["act_sum"][~measured]).all()  # absent, not zero
    assert np.isfinite(run.layers["act_sum"][measured]).all()
    # a ReLU's zero fraction on an unmeasured step is the real one, not a stale copy
    relu = list(run.meta.schema.layer_names).index("1")
    zero = run.layers["act_zero"][:, relu]
    assert 0.0 < zero.min() < zero.max() < 1.0
    assert [f.kind for f in w.findings] == []  # unmeasured steps do not read as dead gradients


def test_a_loss_that_jumps_is_followed_by_full_measurement() -> None:
    """A loss far above its running level switches the budget off for the next HOLD steps, so
    that the detectors see the gradients of a blow-up the budget would otherwise sample."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    jump_at = 70
    with nnwatch.watch(model, opt, name="jump", budget=1e-9, max_interval=8) as w:
        for step in range(140):
            x = torch.randn(16, 12, generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), x[:, :3].argmax(dim=1))
            if step == jump_at:
                loss = loss * 50  # the kind of jump an LR spike makes
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, None))
    measured = nnwatch.load_run(w.run_dir)["layer_sums"] == 1.0
    before = measured[WARMUP_STEPS + 2 * UPDATE_EVERY : jump_at + 1]
    assert before.mean() < 0.5  # the budget was thinning measurements out
    assert measured[jump_at + 1 : jump_at + 1 + HOLD].all()
    assert measured[jump_at + 1 + HOLD :].mean() < 0.5  # and goes back to it after


def _forced_steps(losses: np.ndarray) -> np.ndarray:
    """Which steps the loss trend alone forces to be measured, fed the published losses."""
    from nnwatch.probe.schedule import Schedule

    sched = Schedule(0, 0.01, 32, None)
    forced = np.zeros(len(losses), dtype=bool)
    for step, loss in enumerate(losses):
        forced[step] = step >= WARMUP_STEPS and step < sched.measure_until
        sched.on_loss(step, float(loss))
    return forced


def test_heavy_tailed_losses_near_convergence_buy_short_looks_and_a_climb_the_long_hold() -> None:
    """Minibatch losses near convergence are heavy-tailed: a batch at 2-4x the level is ordinary
    there and must not switch the budget off for 50 steps each time; a climb must."""
    level = 0.08 * np.exp(-np.arange(400) / 400)
    # a converging loss, heavy-tailed per batch (log-normal); before, every batch 2x the level
    # bought 50 steps: 25% and 52% of these steps were forced, now 1.5% and 16%
    for sigma, most in ((0.3, 0.05), (0.45, 0.25)):
        noisy = level * np.random.default_rng(0).lognormal(0.0, sigma, 400)
        forced = _forced_steps(noisy)
        assert forced.mean() < most, f"sigma {sigma}: {forced.sum()} of 400 steps forced"
    for seed in range(3):  # the same noise, climbing 6% a step from step 200
        noisy = level * np.random.default_rng(seed).lognormal(0.0, 0.45, 400)
        climbing = np.concatenate([noisy[:200], noisy[200:260] * 1.06 ** np.arange(60)])
        forced = _forced_steps(climbing)
        first = int(np.argmax(forced[200:])) + 200
        assert forced[first] and first <= 220, "a climb is looked at closely within 20 steps"
        assert forced[first:260].all()  # and held: the climb goes on under full measurement


def test_very_heavy_tailed_losses_are_not_spikes_but_a_loss_above_all_recent_ones_is() -> None:
    """A converged classifier on small batches: most losses near zero, one batch in ten 30x the
    median (log-normal, sigma 1-2.7). Such batches lie within the recent range and are not
    spikes: before the recent-peak rule 82-98% of these steps were forced, now 49-69%. A loss
    far above every recent one is still looked at at once, and held."""
    level = 0.08 * np.exp(-np.arange(2000) / 2000)
    for sigma in (1.0, 1.5, 2.7):
        for seed in range(2):
            noisy = level * np.random.default_rng(seed).lognormal(0.0, sigma, 2000)
            forced = _forced_steps(noisy)
            assert forced.mean() < 0.7, f"sigma {sigma}: {forced.mean():.0%} of steps forced"
            jumped = noisy.copy()
            jumped[1500] = 3.0 * noisy[1436:1500].max()  # a loss the run has not seen lately
            forced = _forced_steps(jumped)
            assert forced[1501 : 1502 + HOLD].all(), f"sigma {sigma}: missed"


def test_guard_catches_nan_on_an_unmeasured_step_before_the_update() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with nnwatch.watch(
        model, opt, name="guard-light", budget=1e-9, max_interval=4, skip_nonfinite=True
    ) as w:
        g = torch.Generator().manual_seed(1)
        _train(model, opt, 45, g, w)
        while internals(w).parts.schedule.measure:  # on to a step the budget leaves unmeasured
            _train(model, opt, 1, g, w)
        poison = w.step_index
        _train(model, opt, 1, g, w, poison=True)
        _train(model, opt, 5, g, w)
    run = nnwatch.load_run(w.run_dir)
    # the guard's check of one small gradient tripped; it then looked at every gradient, and
    # ran the forward again with the layer hooks on: the step is measured after all
    assert run["nonfinite_grads"][poison] == 1.0
    assert run["layer_sums"][poison] == 1.0
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the update was skipped
    nan = [f for f in w.findings if f.kind == "nan_or_inf"]
    assert nan and nan[0].step == poison and nan[0].layer == "0"  # the input was bad
    assert any(e.get("type") == "snapshot" and e.get("step") == poison for e in run.events)
    # the steps after trouble are measured in full
    after = run["layer_sums"][poison + 1 : poison + 6]
    assert (after == 1.0).all() and poison + 5 < poison + 1 + AFTER_TROUBLE


class _NanInBackward(torch.autograd.Function):
    """Identity forward; its backward turns the gradient into NaN (a NaN born mid-backward)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def, override]
        return g * math.nan


class _Middle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _NanInBackward.apply(x) if self.poison else x


def test_guard_sentinel_sees_a_nan_born_inside_backward() -> None:
    torch.manual_seed(0)
    middle = _Middle()
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), middle, nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with nnwatch.watch(model, opt, name="guard-bwd", budget=1e-9, max_interval=4, skip_nonfinite=True) as w:
        g = torch.Generator().manual_seed(1)
        _train(model, opt, 50, g, w)
        while internals(w).parts.schedule.measure:  # move on to a light step
            _train(model, opt, 1, g, w)
        at = w.step_index
        middle.poison = True
        _train(model, opt, 1, g, w)
    run = nnwatch.load_run(w.run_dir)
    assert run["nonfinite_grads"][at] == 1.0
    assert np.isfinite(run["loss"][at])  # the loss was fine: only the backward pass went bad
    nan = [f for f in w.findings if f.kind == "nan_or_inf"]
    assert nan and nan[0].step == at and "backward: first non-finite gradient" in nan[0].message
    assert "forward: first non-finite" not in nan[0].message  # the re-run found the forward clean
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_runs_written_before_layer_sums_read_as_measured(tmp_path) -> None:  # type: ignore[no-untyped-def]
    old = RunSchema(("a",), ("Linear",), ("a",), 1, version=1)
    assert "layer_sums" not in old.scalar_dtype().names
    rows = np.zeros(3, dtype=old.record_dtype())
    assert sums_measured(rows).all()
    meta = RunMeta("old", old, pid=1, host="h", started=0.0)
    assert RunMeta.from_json(meta.to_json()).schema.scalar_dtype() == old.scalar_dtype()


class _PoisonAt(nn.Module):
    """Identity, except that its output holds a NaN when ``poison`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.poison:
            x = x.clone()
            x[0, 0] = math.nan
        return x


def _bn_dropout_model() -> tuple[nn.Module, _PoisonAt]:
    torch.manual_seed(0)
    poison = _PoisonAt()
    model = nn.Sequential(
        nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(32, 32), nn.Tanh(), poison, nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3),
    )  # fmt: skip
    return model, poison


def test_nan_origin_on_an_unmeasured_step_comes_from_a_rerun_that_leaves_no_trace() -> None:
    model, poison = _bn_dropout_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    with nnwatch.watch(model, opt, name="rerun", budget=1e-9, max_interval=4, skip_nonfinite=True) as w:
        _train(model, opt, 45, g, w)
        while internals(w).parts.schedule.measure:
            _train(model, opt, 1, g, w)
        at = w.step_index
        poison.poison = True
        _train(model, opt, 1, g, w)
        poison.poison = False
        rng_after = torch.get_rng_state()
        _train(model, opt, 3, g, w)
    run = nnwatch.load_run(w.run_dir)
    nan = [f for f in w.findings if f.kind == "nan_or_inf"]
    assert nan and nan[0].step == at
    # the origin, found by running that step's forward again: the first watched layer after the
    # poisoning module (a custom module nnwatch does not hook, named as the suspect)
    assert nan[0].layer == "7" and "6 (_PoisonAt)" in nan[0].message, nan[0].message
    assert run["layer_sums"][at] == 1.0
    sums = run.layers[run.layers["step"] == at]["act_sum"][0]
    order = list(run.meta.schema.layer_names)
    assert np.isfinite(sums[: order.index("7")]).all() and not np.isfinite(sums[order.index("7")])
    # the re-run left no trace: BatchNorm counted each step once, and the RNG (dropout) is where
    # a run without nnwatch would have it
    assert int(model[1].num_batches_tracked) == at + 4
    ref, ref_poison = _bn_dropout_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g2 = torch.Generator().manual_seed(3)
    _train(ref, ref_opt, at, g2)
    ref_poison.poison = True
    _train(ref, ref_opt, 1, g2)
    assert torch.equal(torch.get_rng_state(), rng_after)
