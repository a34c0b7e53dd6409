"""Early verdicts and incremental statistics: detectors decide as soon as the evidence is plain,
and their sliding-window statistics equal the ones recomputed from scratch.

Records use the run's real dtype and go through the real :class:`Pipeline`; the optimizer-copy
check runs on a real model and real optimizers.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnwatch.diagnosis.context import RunContext, _optimizer_on_copy
from nnwatch.diagnosis.history import SortedWindow, median, quantile
from nnwatch.diagnosis.pipeline import Pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.unit.test_diagnosis_units import meta, records  # noqa: E402


def feed(rows: np.ndarray, num_classes: int | None = None, **ctx) -> list:
    c = RunContext.from_meta(meta(num_classes))
    if ctx:
        c = replace(c, **ctx)
    return Pipeline(c).feed(rows)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200),
    st.integers(1, 40),
    st.floats(0.0, 1.0),
)
def test_sorted_window_matches_a_recomputed_window(xs, size, q):
    w = SortedWindow(size)
    for i, x in enumerate(xs):
        w.push(x)
        ref = xs[max(0, i + 1 - size) : i + 1]
        assert w.values() == ref
        assert w.median() == median(ref)
        assert w.quantile(q) == pytest.approx(quantile(ref, q))
        assert w.count_above(ref[0]) == sum(1 for v in ref if v > ref[0])


def test_a_clip_that_divides_every_step_by_1000_is_misuse_within_five_steps():
    r = records(60, loss=2.3, grad=1.0)
    r["clip_threshold"] = 1e-3
    found = [f for f in feed(r, num_classes=10) if f.kind == "clipping_misuse"]
    assert found and found[0].step == 4, [(f.step, f.message) for f in found]
    assert found[0].evidence["median_norm_over_threshold"] == pytest.approx(1000.0)


def test_a_tight_clip_the_run_learns_through_waits_for_the_long_window():
    """Large early norms under a clip, but the loss falls fast: no early verdict."""
    r = records(45, grad=1.0)
    r["loss"] = 2.3 * np.exp(-np.arange(45) / 5.0)
    r["clip_threshold"] = 1e-3
    assert [f for f in feed(r, num_classes=10) if f.kind == "clipping_misuse"] == []


def test_tiny_updates_are_a_stall_after_five_steps_but_not_during_a_warmup():
    ctx = {"optimizer": "SGD", "param_norm": 10.0, "total_numel": 1000}
    r = records(30, loss=2.3, grad=1.0, lr=1e-7)
    found = [f for f in feed(r, num_classes=10, **ctx) if f.kind == "loss_stalled"]
    assert found and found[0].step == 4 and found[0].evidence["cause_code"] == 2
    warm = records(30, loss=2.3, grad=1.0, lr=np.linspace(1e-9, 1e-6, 30))  # rises every step
    assert [f for f in feed(warm, num_classes=10, **ctx) if f.kind == "loss_stalled"] == []


def test_an_optimizer_on_a_copy_is_a_stall_with_its_cause_at_step_four():
    r = records(20, loss=2.3)
    found = [f for f in feed(r, num_classes=10, optimizer_on_copy=True) if f.kind == "loss_stalled"]
    assert found and found[0].step == 4 and found[0].evidence["cause_code"] == 4
    assert "copy" in found[0].message
    assert [f for f in feed(r, num_classes=10) if f.kind == "loss_stalled"] == []


def test_optimizer_on_copy_is_told_from_master_weights_and_the_model_itself():
    import copy

    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    params = tuple(model.parameters())
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    on_copy = torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.1)
    master = torch.optim.SGD([p.detach().double().requires_grad_() for p in params], lr=0.1)
    head_only = torch.optim.SGD(model[2].parameters(), lr=0.1)
    assert _optimizer_on_copy(on_copy, params) is True
    assert _optimizer_on_copy(own, params) is False
    assert _optimizer_on_copy(master, params) is False  # fp64 master copies: another setup
    assert _optimizer_on_copy(head_only, params) is False
    assert _optimizer_on_copy(None, params) is False


@pytest.mark.parametrize(
    ("loss0", "logit_std", "expect"),
    [
        (2.9, 1.5, False),  # ln 4 + 1.5^2/2 = 2.51: what a default head on trained features gives
        (2.9, 0.3, True),  # the same loss with near-zero logits is not explained by their spread
        (9.0, 1.5, True),  # far above what the spread explains
        (9.0, 6.0, True),  # oversized logits are the problem itself
    ],
)
def test_initial_loss_is_judged_against_the_spread_of_the_first_logits(loss0, logit_std, expect):
    r = records(5, loss=loss0)
    r["act_std"][0] = [1.0, 1.0, 1.0, 1.0, logit_std]
    found = [f for f in feed(r, num_classes=4) if f.kind == "bad_initial_loss"]
    assert bool(found) is expect, [f.message for f in found]


def test_loss_detectors_give_the_same_verdicts_on_a_long_noisy_run_with_a_blow_up():
    """A long healthy stretch (the incremental windows wrap many times), then a sustained blow-up:
    exactly one divergence, found within 5 steps, and no spike or oscillation before it."""
    rng = np.random.default_rng(3)
    n = 700
    r = records(n, grad=1.0)
    loss = 0.5 + 1.5 * np.exp(-np.arange(n) / 100.0) + 0.05 * rng.standard_normal(n)
    loss[600:] = 5.0 + 0.05 * rng.standard_normal(100) + np.arange(100) * 0.05
    r["loss"] = loss
    found = feed(r, num_classes=10)
    div = [f for f in found if f.kind == "loss_diverging"]
    assert len(div) == 1 and 600 <= div[0].step <= 605, [(f.kind, f.step) for f in found]
    assert not [f for f in found if f.step < 600 and f.severity != "info"]
    assert math.isfinite(div[0].evidence["loss_before"])
