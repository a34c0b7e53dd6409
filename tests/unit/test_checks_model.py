"""initial_loss, single_batch_overfit and gradient_check on real models, healthy and broken."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from nnwatch.checks import (  # noqa: E402
    gradient_check,
    initial_loss,
    single_batch_overfit,
)
from tests.fixtures import check_factories as F  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using a target size:UserWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread, and a busy 2-core box makes extra threads thrash."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(spec, fn, **kw):
    return fn(spec["model"], spec["batch"], spec["loss_fn"], **kw)


# ----------------------------------------------------------------------------------------------
# initial loss


def test_initial_loss_healthy_is_near_ln_k():
    spec = F.healthy()
    r = initial_loss(spec["model"], spec["batch"], spec["loss_fn"], 10)
    assert r.passed and r.verdict == "OK" and r.causes == []
    assert r.expected == pytest.approx(math.log(10))
    assert abs(r.measured - math.log(10)) <= r.tolerance
    assert r.tolerance == pytest.approx(0.1 * math.log(10) + 0.05)
    assert "expected ln(10) = 2.3026" in r.summary()


def test_initial_loss_infers_k_from_the_output():
    spec = F.healthy()
    r = initial_loss(spec["model"], spec["batch"], spec["loss_fn"])
    assert r.num_classes == 10 and r.passed


def test_initial_loss_double_softmax():
    spec = F.double_softmax()
    r = _run(spec, initial_loss)
    # the value alone looks fine (CE of near-uniform probabilities is ~ln K)...
    assert abs(r.measured - math.log(10)) < 0.05
    # ...but the outputs already sum to 1, and the check says so
    assert not r.passed and r.verdict == "SOFTMAX TWICE"
    assert "softmax" in r.causes[0]


def test_initial_loss_unnormalized_inputs():
    r = _run(F.unnormalized(), initial_loss)
    assert not r.passed and r.verdict == "TOO HIGH"
    assert r.causes[0].startswith("un-normalized inputs")


def test_initial_loss_bad_last_layer_init():
    r = _run(F.exploding_init(), initial_loss)
    assert not r.passed and r.verdict == "TOO HIGH"
    assert any("last layer 'head'" in c for c in r.causes)


def test_initial_loss_summed_over_the_batch():
    spec = F.healthy()
    r = initial_loss(spec["model"], spec["batch"], nn.CrossEntropyLoss(reduction="sum"), 10)
    assert not r.passed and r.measured == pytest.approx(64 * math.log(10), rel=0.05)
    assert "reduction='sum'" in r.causes[0]


def test_initial_loss_non_finite():
    spec = F.healthy()
    with torch.no_grad():
        spec["model"].head.weight[0, 0] = float("nan")
    r = _run(spec, initial_loss)
    assert not r.passed and r.verdict == "NON-FINITE"


def test_initial_loss_skips_regression():
    r = _run(F.healthy_regression(), initial_loss)
    assert r.passed and r.skipped and r.expected is None
    assert "does not apply" in r.summary()


# ----------------------------------------------------------------------------------------------
# single-batch overfit


def test_overfit_healthy_passes_with_defaults():
    spec = F.healthy()
    r = _run(spec, single_batch_overfit)
    assert r.passed and r.verdict == "PASSED" and r.causes == []
    assert r.num_samples == 16 and r.optimizer == "AdamW(lr=0.01)"
    assert r.passed_at_step is not None and r.passed_at_step < 200
    assert r.final_loss < 0.01 and r.final_accuracy == 1.0
    assert len(r.losses) == r.passed_at_step + 1
    assert r.losses[0] == pytest.approx(math.log(10), abs=0.3)
    assert r.summary().startswith(f"step {r.passed_at_step}: loss ")
    assert r.summary().endswith("acc 100.0%")


def test_overfit_cnn_passes():
    assert _run(F.healthy_cnn(), single_batch_overfit).passed


def test_overfit_double_softmax_fails():
    r = _run(F.double_softmax(), single_batch_overfit)
    assert not r.passed and r.passed_at_step is None and r.steps_run == 200
    assert r.best_loss > 1.0  # probabilities as logits cap the confidence
    assert any("softmax" in c for c in r.causes)


def test_overfit_dead_network_fails_and_names_the_layer():
    r = _run(F.dead_network(), single_batch_overfit)
    assert not r.passed
    assert r.dead_units.get("body.1") == 1.0
    assert "body.0" in r.zero_grad_layers
    assert any(c.startswith("dead units") and "body.1" in c for c in r.causes)
    assert any("same for every sample" in c for c in r.causes)


def test_overfit_lr_too_high_fails():
    spec = F.high_lr()
    r = _run(spec, single_batch_overfit, optimizer=spec["optimizer"])
    assert not r.passed and r.optimizer == "SGD(lr=50)"
    assert "learning rate is too high" in r.causes[0]
    assert spec["optimizer"].state == {}


def test_overfit_params_missing_from_the_users_optimizer():
    spec = F.missing_params()
    user_opt = spec["optimizer"]
    r = _run(spec, single_batch_overfit, optimizer=user_opt)
    assert r.not_in_optimizer == ["head.weight", "head.bias"]
    assert not r.passed
    assert "missing from the optimizer" in r.causes[0] and "head.weight" in r.causes[0]
    # the user's optimizer and model were not touched
    assert user_opt.state == {}
    assert all(p.grad is None for p in spec["model"].parameters())


def test_overfit_params_missing_via_factory_and_all_present_control():
    spec = F.healthy()

    def body_only(params):
        return torch.optim.AdamW(params[:-2], lr=1e-2)

    r = _run(spec, single_batch_overfit, optimizer_factory=body_only)
    assert r.not_in_optimizer == ["head.weight", "head.bias"] and not r.passed
    ok = _run(
        spec, single_batch_overfit, optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=1e-2)
    )
    assert ok.passed and ok.not_in_optimizer == []


def test_overfit_zero_lr_fails():
    r = _run(
        F.healthy(),
        single_batch_overfit,
        optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.0),
        steps=30,
    )
    assert not r.passed
    assert r.causes[0] == "a zero learning rate in at least one parameter group"


def _step_without_zero_grad(model, opt, batch, loss_fn):
    x, y = batch
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _correct_step(model, opt, batch, loss_fn):
    x, y = batch
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss, model


def test_overfit_detects_missing_zero_grad_in_the_users_loop():
    spec = F.healthy()
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
    r = _run(spec, single_batch_overfit, train_step=_step_without_zero_grad, optimizer_factory=sgd)
    assert r.grads_accumulate and not r.passed
    assert any("zero_grad() is missing" in c for c in r.causes)
    good = _run(spec, single_batch_overfit, train_step=_correct_step, optimizer_factory=sgd)
    assert good.passed and not good.grads_accumulate


def test_overfit_allows_deliberate_accumulation():
    r = _run(
        F.healthy(),
        single_batch_overfit,
        train_step=_step_without_zero_grad,
        allow_grad_accumulation=True,
        steps=5,
    )
    assert not r.grads_accumulate


class _Disconnected(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 10)

    def forward(self, x):
        return torch.tensor(self.lin(x).tolist())  # values copied out: the graph is cut


def test_overfit_fully_disconnected_graph():
    x, y = F.digits(16)
    r = single_batch_overfit(_Disconnected(), (x, y), nn.CrossEntropyLoss())
    assert not r.passed
    assert r.causes[0].startswith("disconnected graph")


class _PartlyDetached(F.Net):
    def forward(self, x):
        return self.head(self.body(x).detach())


def test_overfit_reports_parameters_without_gradient():
    torch.manual_seed(0)
    x, y = F.digits(16)
    r = single_batch_overfit(_PartlyDetached(), (x, y), nn.CrossEntropyLoss())
    assert "body.0.weight" in r.without_grad and "head.weight" not in r.without_grad
    text = " ".join(r.causes + r.warnings)
    assert "body.0.weight" in text


def test_overfit_label_mismatch_with_conflicting_duplicates():
    x, y = F.digits(16)
    x[8:] = x[:8]
    y[8:] = (y[:8] + 1) % 10  # the same images with other labels: impossible to fit
    torch.manual_seed(0)
    r = single_batch_overfit(F.Net(), (x, y), nn.CrossEntropyLoss(), steps=60)
    assert not r.passed
    assert any("identical inputs but different labels" in c for c in r.causes)


def test_overfit_regression_passes_and_broadcast_mismatch_fails():
    ok = _run(F.healthy_regression(), single_batch_overfit)
    assert ok.passed and ok.task == "regression" and ok.final_accuracy is None
    assert ok.final_loss < ok.threshold == pytest.approx(0.01 * ok.losses[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad = _run(F.regression_broadcast(), single_batch_overfit)
    assert not bad.passed
    assert bad.causes[0].startswith("label mismatch: output shape (16, 1) vs target shape (16,)")


def test_overfit_explicit_regression_threshold():
    r = _run(F.healthy_regression(), single_batch_overfit, regression_threshold=1e-9, steps=20)
    assert not r.passed and r.threshold == 1e-9


# ----------------------------------------------------------------------------------------------
# gradient check


def test_gradient_healthy_and_clipping_keeps_direction():
    spec = F.healthy()
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"], max_norm=0.1)
    assert r.verdict == "HEALTHY" and r.passed
    assert r.raw_norm > 0.1
    assert r.clipped_norm == pytest.approx(0.1, rel=1e-4)
    assert r.cosine == pytest.approx(1.0, abs=1e-6)
    assert r.clamped_cosine < 0.99  # value clamping bends the direction
    assert set(r.layer_norms) == {"body.0", "body.2", "head"}
    # the raw norm is exactly what torch reports for the same backward pass
    net = F.healthy()["model"]
    x, y = spec["batch"]
    nn.CrossEntropyLoss()(net(x), y).backward()
    assert r.raw_norm == float(torch.nn.utils.clip_grad_norm_(net.parameters(), 0.1))


def test_gradient_exploding():
    spec = F.exploding_init()
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"], max_norm=1.0)
    assert not r.passed and r.verdict == "EXPLODING: clipping recommended"
    assert r.raw_norm > 10
    assert r.clipped_norm == pytest.approx(1.0, rel=1e-4)
    assert r.cosine == pytest.approx(1.0, abs=1e-6)
    assert r.clamped_cosine < 0.9
    assert r.summary().startswith(f"{r.raw_norm:.2f} -> 1.0000 (max_norm 1.0), cosine 1.0000")


def test_gradient_vanishing_dead_network_names_zero_layers():
    spec = F.dead_network()
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"])
    assert r.verdict == "VANISHING" and not r.passed
    assert r.zero_grad_layers == ["body.0"]
    assert "body.0" in r.causes[0]


def test_gradient_vanishing_deep_sigmoid_names_early_layers():
    spec = F.deep_sigmoid()
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"])
    assert r.verdict == "VANISHING"
    assert "layers whose gradient is below" in r.causes[0]
    assert r.causes[0].split(": ", 1)[1].startswith("0, ")  # the first layer is named first


def test_gradient_non_finite():
    spec = F.healthy()
    with torch.no_grad():
        spec["model"].body[0].weight[0, 0] = float("nan")
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"])
    assert r.verdict == "NON-FINITE" and not r.passed


def test_gradient_names_a_dominating_layer():
    spec = F.healthy_cnn()
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"])
    assert r.passed and r.dominant_layers == ["head"]
    assert "head" in r.warnings[0]


def test_gradient_check_other_norm_types():
    spec = F.exploding_init()
    r = gradient_check(spec["model"], spec["batch"], spec["loss_fn"], norm_type=math.inf)
    assert r.norm_type == math.inf and r.cosine == pytest.approx(1.0, abs=1e-6)
    assert r.clipped_norm == pytest.approx(1.0, rel=1e-4)


def test_overfit_with_a_timid_lr_says_the_loss_was_still_falling():
    r = _run(
        F.healthy(),
        single_batch_overfit,
        optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=1e-2),
        steps=40,
    )
    assert not r.passed
    assert r.causes[0].startswith("the loss was still falling after 40 steps")
