"""The rule-out table, one row at a time: each fact removes its remedy, and only that fact does."""

from __future__ import annotations

import numpy as np
import pytest

from nnwatch.diagnosis.differential import RULES_OUT, observed_causes, remedy_text, ruled_out
from nnwatch.diagnosis.observed import Observations


def _state(why: str) -> Observations:
    """Observations in which exactly the fact ``why`` holds."""
    o = Observations()
    o.lr, o.lr_peak = 1e-3, 1e-3
    setups = {
        "the LR is negative": lambda: setattr(o, "negative_lr", 1) or setattr(o, "lr", -1e-3),
        "the gradients are not cleared": lambda: setattr(o, "kept", 3),
        "the LR is already scheduled down 1000x": lambda: setattr(o, "lr", 1e-9),
        "the LR is 0": lambda: setattr(o, "nonpositive_lr", 5),
        "the loss does not depend on the parameters": lambda: setattr(o, "zero_grad", 5),
        "the loss diverges": lambda: o.active.add("loss_diverging"),
        "the gradients explode": lambda: o.active.add("exploding_gradients"),
        "the run clips already": lambda: (setattr(o, "clip_threshold", 1.0), o.clip_steps.append(1)),
        "the clip never fired": lambda: (setattr(o, "clip_threshold", 1.0), o.clip_steps.append(0)),
    }
    setups[why]()
    return o


ROWS = [(remedy, why) for remedy, rows in RULES_OUT.items() for why, _ in rows]


@pytest.mark.parametrize(("remedy", "why"), ROWS)
def test_each_row_rules_its_remedy_out(remedy: str, why: str) -> None:
    o = _state(why)
    assert ruled_out(remedy, o) is not None
    text = remedy_text(o, [(remedy, "THE REMEDY"), ("", "always kept")])
    assert "THE REMEDY" not in text and "always kept" in text


def test_nothing_is_ruled_out_on_a_clean_run() -> None:
    o = Observations()
    o.lr, o.lr_peak = 1e-3, 1e-3
    for remedy in RULES_OUT:
        if remedy == "clip_bounds":
            continue  # it needs a clip that fires
        assert ruled_out(remedy, o) is None, remedy
    assert observed_causes(o) == []


def test_observed_causes_come_first_with_their_numbers() -> None:
    o = _state("the gradients are not cleared")
    text = remedy_text(o, [("lower_lr", "lower the LR"), ("", "look at the batches")])
    assert text.startswith("in this order: 1) call optimizer.zero_grad()")
    assert "lower the LR" not in text
    assert observed_causes(o)[0].value == 3.0


def test_a_warmup_from_zero_is_not_an_lr_fault() -> None:
    from nnwatch.diagnosis.row import Row

    o = Observations()
    for step, lr in enumerate(np.linspace(0.0, 1e-3, 10)):
        row = Row.__new__(Row)
        row.step, row.loss, row.grad_norm, row.clip_threshold = step, 2.0, 1.0, np.nan
        row.grads_kept, row.lr = 0.0, np.array([lr])
        row.label_entropy = row.params_no_grad = row.params_unoptimized = np.nan
        row.label_mean = row.label_var = np.nan
        row.update_frozen = row.batch_size = np.nan
        row.update_layer = row.weight_layer = row.frozen_layer = row.act_rows = None
        row.grad_layer, row.measured = np.zeros(0), False
        o.push(row)
    assert observed_causes(o) == []
