"""A watch that starts on a model which has trained already (resuming from a checkpoint).

"The first loss should be near ln K" holds for a fresh classifier only. When the optimizer already
holds state at ``watch()`` time the run has trained before, so the check stays quiet, live and
offline; a fresh optimizer on trained weights still gets the finding, with a remedy that names
that case.
"""

from __future__ import annotations

import json

import torch
from torch import nn

import nnwatch
from nnwatch.diagnosis import Finding
from nnwatch.diagnosis.offline import diagnose_run
from nnwatch.probe.watch import internals

K = 4


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, K, (64,), generator=g)
    x = torch.randn(64, 8, generator=g) + 3.0 * nn.functional.one_hot(y, 8).float()
    return x, y


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> nnwatch.Watch:
    x, y = _data()
    with nnwatch.watch(model, opt, num_classes=K, name="resume") as w:
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            w.step(loss, batch=(x, y))
    return w


def _initial_loss_findings(w: nnwatch.Watch) -> list[Finding]:
    return [f for f in w.findings if f.kind == "bad_initial_loss"]


def test_a_resumed_run_is_not_told_its_first_loss_is_below_chance() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, K))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    first = _train(model, opt, 60)
    assert not internals(first).meta.extra["resumed"] and _initial_loss_findings(first) == []
    assert nnwatch.load_run(first.run_dir)["loss"][-1] < 0.2  # far below ln 4 = 1.39

    # the same loop goes on under a second watch: the optimizer has state, the model has trained
    second = _train(model, opt, 10)
    assert internals(second).meta.extra["resumed"]
    assert _initial_loss_findings(second) == []
    meta = json.loads((second.run_dir / "meta.json").read_text())
    assert meta["extra"]["resumed"] is True
    assert [f for f in diagnose_run(second.run_dir) if f.kind == "bad_initial_loss"] == []

    # trained weights under a fresh optimizer look like a fresh run: the finding comes, and says why
    fresh = _train(model, torch.optim.Adam(model.parameters(), lr=0.05), 10)
    assert not internals(fresh).meta.extra["resumed"]
    (f,) = _initial_loss_findings(fresh)
    assert f.evidence["initial_loss"] < 0.2 and "trained weights" in f.remedy


def test_a_resumed_run_goes_on_with_the_optimizers_step_count() -> None:
    """Loaded from a checkpoint: the optimizer's state says 60 steps were taken; the records of
    the resumed run are steps 60, 61, ... and a start_step= given by the user wins."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, K))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    _train(model, opt, 60)
    checkpoint = {"model": model.state_dict(), "opt": opt.state_dict()}

    model2 = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, K))
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.05)
    model2.load_state_dict(checkpoint["model"])
    opt2.load_state_dict(checkpoint["opt"])
    resumed = _train(model2, opt2, 15)
    run = nnwatch.load_run(resumed.run_dir)
    assert run["step"].tolist() == list(range(60, 75))
    assert run.meta.extra["start_step"] == 60
    assert not [f for f in resumed.findings if f.kind == "bad_initial_loss"]

    model3 = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, K))
    x, y = _data()
    with nnwatch.watch(model3, None, name="given", start_step=1000) as w:
        for _ in range(3):
            model3.zero_grad()
            loss = nn.functional.cross_entropy(model3(x), y)
            loss.backward()
            w.step(loss)
    assert nnwatch.load_run(w.run_dir)["step"].tolist() == [1000, 1001, 1002]
