"""Optimizers as real code passes them: a hand-written torch.optim subclass, a wrapper that is not
an Optimizer (Lookahead-style), a subclass that skips ``Optimizer.__init__`` (as Accelerate's
does), an optimizer of its own with no torch optimizer inside, and a list of optimizers.

None of them may stop ``watch()``; where a torch optimizer can be found, its step pre-hook marks
the update, so a loop that zeroes the gradients before ``w.step()`` still has its norms.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.probe.optimizer_target import resolve


class Lion(torch.optim.Optimizer):
    """Lion, written as people write their own optimizers."""

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99)) -> None:
        super().__init__(params, {"lr": lr, "betas": betas})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                p.add_((m * b1 + p.grad * (1 - b1)).sign_(), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


class Lookahead:
    """Not an Optimizer: slow weights pulled towards the fast ones every k steps."""

    def __init__(self, base: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5) -> None:
        self.base, self.k, self.alpha, self.count = base, k, alpha, 0
        self.param_groups = base.param_groups
        self.slow = [p.detach().clone() for g in base.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none)

    def step(self) -> None:
        self.base.step()
        self.count += 1
        if self.count % self.k == 0:
            with torch.no_grad():
                fast = [p for g in self.param_groups for p in g["params"]]
                for slow, p in zip(self.slow, fast, strict=True):
                    slow.add_(p - slow, alpha=self.alpha)
                    p.copy_(slow)


class SkipsInit(torch.optim.Optimizer):
    """A subclass that never calls ``Optimizer.__init__``: its own step runs no step hooks."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:  # noqa: D107 - no super().__init__
        self.optimizer = inner

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.optimizer.step(closure)


class OwnSGD:
    """An optimizer of its own, with param groups and no torch optimizer inside."""

    def __init__(self, params: Any, lr: float) -> None:
        self.param_groups = [{"params": list(params), "lr": lr}]

    def zero_grad(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.add_(p.grad, alpha=-self.param_groups[0]["lr"])


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(model: nn.Module, opt: Any, steps: int, *, zero_before_w_step: bool, name: str) -> tuple[Any, list[float], list[float]]:
    """A loop clipping with torch (returned norms) and rescaling by hand (the norm it leaves)."""
    g = torch.Generator().manual_seed(1)
    returned, after = [], []
    with nnwatch.watch(model, opt, name=name, budget=None) as w:
        for _ in range(steps):
            x = torch.randn(16, 12, generator=g)
            loss = nn.functional.cross_entropy(model(x), x[:, :4].argmax(dim=1))
            loss.backward()
            returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)))
            after.append(float(torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in model.parameters()])
            )))
            opt.step()
            if zero_before_w_step:
                opt.zero_grad()  # the gradients are gone by the time w.step() runs
            w.step(loss)
            if not zero_before_w_step:
                opt.zero_grad()
    return nnwatch.load_run(w.run_dir), returned, after


@pytest.mark.parametrize("wrap", ["subclass", "lookahead", "skips_init"])
def test_the_torch_optimizer_inside_marks_the_update(wrap: str, caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    lion = Lion(model.parameters(), lr=3e-3)
    opt: Any = {"subclass": lion, "lookahead": Lookahead(lion), "skips_init": SkipsInit(lion)}[wrap]
    with caplog.at_level(logging.WARNING, logger="nnwatch"):
        run, returned, after = _train(model, opt, 40, zero_before_w_step=True, name=f"opt-{wrap}")
    assert run.status == "finished"
    np.testing.assert_array_equal(run["grad_norm"], np.float32(returned))  # torch's clip, bitwise
    # read at the inner optimizer's step, before the gradients were zeroed
    np.testing.assert_allclose(run["grad_norm_clipped"], after, rtol=1e-5)
    assert (run["clip_threshold"] == 0.3).all()
    assert (run["lr"][:, 0] == 3e-3).all()
    said = " ".join(r.getMessage() for r in caplog.records)
    if wrap == "subclass":
        assert "optimizer passed" not in said
    else:
        assert f"({type(opt).__name__}) wraps Lion: gradients are read right before the Lion's step()" in said


def test_an_optimizer_of_its_own_gives_w_step_the_update(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    opt = OwnSGD(model.parameters(), lr=0.05)
    with caplog.at_level(logging.WARNING, logger="nnwatch"):
        run, returned, after = _train(model, opt, 30, zero_before_w_step=False, name="opt-own")
    assert run.status == "finished"
    np.testing.assert_array_equal(run["grad_norm"], np.float32(returned))
    np.testing.assert_allclose(run["grad_norm_clipped"], after, rtol=1e-5)
    assert (run["lr"][:, 0] == 0.05).all()  # read from its param_groups
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "(OwnSGD) is not a torch.optim.Optimizer nor wraps one: w.step() marks the update" in said


def test_a_list_of_optimizers_is_not_a_reason_to_stop(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[2:].parameters(), lr=0.1)]
    g = torch.Generator().manual_seed(2)
    with caplog.at_level(logging.WARNING, logger="nnwatch"):
        with nnwatch.watch(model, opts, name="opt-list") as w:
            for _ in range(12):
                x = torch.randn(8, 12, generator=g)
                loss = model(x).square().mean()
                loss.backward()
                for o in opts:
                    o.step()
                    o.zero_grad()
                w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert run.status == "finished" and len(run["loss"]) == 12
    assert "(list) is not a torch.optim.Optimizer" in " ".join(r.getMessage() for r in caplog.records)


def test_resolve_reports_what_it_hooks() -> None:
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert resolve(None).hook is None and resolve(None).note is None
    plain = resolve(sgd)
    assert plain.hook is sgd and plain.source is sgd and plain.note is None
    nested = resolve(Lookahead(SkipsInit(sgd)))  # type: ignore[arg-type]
    assert nested.hook is sgd and nested.note is not None
    own = resolve(OwnSGD(model.parameters(), 0.1))
    assert own.hook is None and isinstance(own.source, OwnSGD)
    assert resolve(object()).source is None


def test_lbfgs_closure_records_the_last_evaluations_gradient() -> None:
    """LBFGS runs forward and backward inside ``optimizer.step(closure)``, several times per
    update, after the step's pre-hook: the recorded norm is the gradient of the closure's last
    evaluation, not the previous update's gradients that the pre-hook sees."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
    x = torch.randn(256, 4)
    y = (x**2).sum(1, keepdim=True)
    # a line search: the number of evaluations differs from one update to the next
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=20, line_search_fn="strong_wolfe")
    last: list[float] = []
    evaluations: list[int] = []
    with nnwatch.watch(model, opt, name="lbfgs", budget=None) as w:
        for _ in range(15):
            norms: list[torch.Tensor] = []

            def closure(norms: list[torch.Tensor] = norms) -> torch.Tensor:
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
                return loss

            loss = opt.step(closure)
            last.append(float(norms[-1]))
            evaluations.append(len(norms))
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert min(evaluations) > 1 and len(set(evaluations)) > 1  # several, and not always as many
    np.testing.assert_allclose(run["grad_norm"], last, rtol=1e-5)
    assert np.isfinite(run["loss"]).all()
