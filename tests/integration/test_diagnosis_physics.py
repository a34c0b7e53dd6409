"""Issue 32's defects, each reproduced by a real training loop through the public API.

Every test here failed before the change it names: a finite float64 loss read as Inf, spikes
falling between sampled norms, remedies the records contradict, causes guessed instead of read.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.tensors.grad_norms import recorded_squares

pytestmark = pytest.mark.usefixtures("nnwatch_run_dir")


@pytest.fixture(params=["thread", "process"])
def nnwatch_run_dir(request, tmp_path, monkeypatch):
    """Each loop twice: the detectors in the writer thread, and moved at once to a process of
    their own (what a fast loop does by itself): both must judge alike."""
    d = tmp_path / "runs"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(d))
    monkeypatch.setenv("NNWATCH_DETECTORS", request.param)
    torch.set_num_threads(1)


def _digits(n: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    return x, (x @ w).argmax(1)


def _mlp(seed: int = 0, out: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, out))


def _train(model, opt, steps, w, *, zero_grad=True, sched=None, clip=None, loss_fn=None, bs=32):
    x, y = _digits()
    loss_fn = loss_fn or nn.functional.cross_entropy
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        i = torch.randint(0, len(x), (bs,), generator=g)
        if zero_grad:
            opt.zero_grad()
        loss = loss_fn(model(x[i]), y[i])
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        w.step(loss, batch=(x[i], y[i]))


def _remedies(w) -> str:
    return " ".join(f.remedy for f in w.findings)


def test_a_finite_float64_loss_beyond_float32_is_never_called_non_finite(recwarn):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.full((8, 4), 1e20, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the numpy overflow warning used to leak to stderr
        with nnwatch.watch(model, opt, name="f64") as w:
            for _ in range(12):
                opt.zero_grad()
                loss = (model(x) ** 2).mean()
                assert math.isfinite(loss.item()) and loss.item() > 1e38
                loss.backward()
                opt.step()
                w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert np.isfinite(run["loss"]).all() and np.isfinite(run["grad_norm"]).all()
    assert (run["nonfinite_grads"] == 0.0).all()
    assert "nan_or_inf" not in {f.kind for f in w.findings}


def test_the_global_norm_is_recorded_on_every_step_without_a_clip():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = _digits()
    norms, replays = [], []
    with nnwatch.watch(model, opt, name="every", budget=1e-9, max_interval=8) as w:
        for s in range(120):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[s % 16 :: 16]), y[s % 16 :: 16])
            loss.backward()
            norms.append(float(torch.linalg.vector_norm(torch.stack(
                [p.grad.norm() for p in model.parameters()]))))  # fmt: skip
            grads = [p.grad for p in model.parameters()]
            replays.append(np.float32(recorded_squares(grads, torch.device("cpu"))[1]))
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert (run["layer_sums"] == 0.0).any()  # the budget left steps unmeasured ...
    assert np.allclose(run["grad_norm"], norms, rtol=1e-5)  # ... yet every norm is there
    # and replay's norm is the recorded one to the bit, on measured and unmeasured steps alike
    np.testing.assert_array_equal(np.asarray(run["grad_norm"], dtype=np.float32), replays)


def test_missing_zero_grad_is_observed_and_never_blamed_on_the_lr():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with nnwatch.watch(model, opt, num_classes=4, name="nozero") as w:
        _train(model, opt, 120, w, zero_grad=False)
    f = [f for f in w.findings if f.kind == "grads_not_cleared"]
    assert f and f[0].step <= 4 and "zero_grad()" in f[0].remedy
    assert "lower the LR" not in _remedies(w)


def test_zero_grad_that_zeroes_in_place_is_cleared():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _digits()
    with nnwatch.watch(model, opt, num_classes=4, name="inplace") as w:
        for s in range(40):
            opt.zero_grad(set_to_none=False)
            loss = nn.functional.cross_entropy(model(x[s::16]), y[s::16])
            loss.backward()
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert (run["grads_kept"][1:] == 0.0).all()
    assert "grads_not_cleared" not in {f.kind for f in w.findings}


def test_a_per_epoch_scheduler_stepped_every_batch_is_named_as_the_cause():
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.1)  # meant per epoch
    with nnwatch.watch(model, opt, num_classes=4, name="steplr") as w:
        _train(model, opt, 260, w, sched=sched)
    f = [f for f in w.findings if f.kind == "loss_stalled" and f.severity == "warning"]
    assert f and f[0].step < 259
    assert "scheduler" in f[0].remedy and "LR fell" in f[0].summary


def test_a_negative_lr_is_named_and_lowering_it_is_not_advised():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3e-3)
    for group in opt.param_groups:  # a sign error in a hand-written schedule (torch refuses lr<0)
        group["lr"] = -3e-3
    with nnwatch.watch(model, opt, num_classes=4, name="neglr") as w:
        _train(model, opt, 80, w)
    f = [f for f in w.findings if f.kind == "lr_negative"]
    assert f and f[0].step == 0 and f[0].severity == "error"
    assert "lower the LR" not in _remedies(w)


def test_a_loss_that_ignores_the_weights_is_not_vanishing_gradients():
    """The DDP tutorial's shape: cross_entropy over a single logit is exactly 0 on every step."""
    model = _mlp(out=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, _ = _digits()
    with nnwatch.watch(model, opt, name="onelogit") as w:
        for s in range(30):
            opt.zero_grad()
            out = model(x[s::16])
            loss = nn.functional.cross_entropy(out, torch.zeros(len(out), dtype=torch.long))
            assert loss.item() == 0.0
            loss.backward()
            opt.step()
            w.step(loss)
    kinds = {f.kind for f in w.findings}
    assert "vanishing_gradients" not in kinds
    f = [f for f in w.findings if f.kind == "loss_stalled"]
    assert f and f[0].severity == "warning" and "does not depend on the parameters" in f[0].summary
    assert "fix the init" not in _remedies(w)


def test_a_run_that_clips_is_not_told_to_clip():
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(16, 16), nn.LeakyReLU())], nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    with nnwatch.watch(model, opt, num_classes=4, name="clips") as w:
        _train(model, opt, 120, w, clip=1.0)
    text = _remedies(w)
    assert "clip gradients at" not in text and "clip_grad_norm_(model.parameters(), 1.0)" not in text
    for f in w.findings:
        times = f.evidence.get("times_usual")
        if f.kind == "exploding_gradients" and times is not None and "usual" in f.summary:
            assert times >= 3.0  # never "17.1 is 0.981x this run's usual"


def test_a_gan_at_published_defaults_is_judged_by_the_game():
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    data = torch.tensor(load_digits().data / 8.0 - 1.0, dtype=torch.float32)
    G = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh())
    D = nn.Sequential(nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    opt_g = torch.optim.Adam(G.parameters(), 2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), 2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    with nnwatch.watch(G, opt_g, name="G") as wg, nnwatch.watch(D, opt_d, name="D") as wd:
        for _ in range(300):
            real = data[torch.randint(0, len(data), (64,))]
            fake = G(torch.randn(64, 16))
            opt_d.zero_grad()
            loss_d = bce(D(real), torch.ones(64, 1)) + bce(D(fake.detach()), torch.zeros(64, 1))
            loss_d.backward()
            opt_d.step()
            wd.step(loss_d)
            opt_g.zero_grad()
            loss_g = bce(D(fake), torch.ones(64, 1))
            loss_g.backward()
            opt_g.step()
            wg.step(loss_g)
    for w in (wg, wd):
        bad = [f.kind for f in w.findings if f.severity != "info"]
        assert bad == [], (w.name, bad)


def test_a_healthy_scaler_started_at_two_to_the_32_calibrates_without_a_finding():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**32)
    x, y = _digits()
    with nnwatch.watch(model, opt, scaler, num_classes=4, name="amp32") as w:
        for s in range(80):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x[s % 16 :: 16]), y[s % 16 :: 16])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert (run["amp_skipped"] == 1.0).sum() >= 5  # it did halve through calibration
    assert "amp_scale_collapse" not in {f.kind for f in w.findings}


def test_the_live_nan_origin_agrees_with_check_on_a_measured_step():
    """A NaN born in the backward (sqrt of 0) with a finite forward: the live finding used to
    name the first layer's output, which the log shows finite."""
    from nnwatch.diagnosis.offline import diagnose_run

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), 0.01)
    with nnwatch.watch(model, opt, name="nanback") as w:
        for s in range(12):
            x = torch.zeros(16, 8) if s == 5 else torch.randn(16, 8)
            opt.zero_grad()
            out = model(x)
            loss = (out - out.detach()).pow(2).sum().sqrt() if s == 5 else out.pow(2).mean()
            loss.backward()
            opt.step()
            w.step(loss)
    live = [f for f in w.findings if f.kind == "nan_or_inf"]
    offline = [f for f in diagnose_run(w.run_dir) if f.kind == "nan_or_inf"]
    assert live and offline and live[0].step == offline[0].step == 5
    assert live[0].evidence["forward_layer_index"] == offline[0].evidence["forward_layer_index"] == -1
    assert live[0].evidence["backward_layer_index"] == offline[0].evidence["backward_layer_index"]
    assert "loss" not in live[0].evidence  # the guard runs before the loss reaches w.step()


def test_zero_grad_between_backward_and_step_is_a_stall_with_that_cause():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _digits()
    with nnwatch.watch(model, opt, num_classes=4, name="wiped") as w:
        for s in range(40):
            loss = nn.functional.cross_entropy(model(x[s::16]), y[s::16])
            loss.backward()
            opt.zero_grad()  # the bug: the gradients go before the update can use them
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert (run["grad_norm"][1:] > 0).all() and (run["grad_norm_clipped"] == 0.0).all()
    f = [f for f in w.findings if f.kind == "loss_stalled"]
    assert f and f[0].severity == "warning" and f[0].step <= 5
    assert "between backward() and step()" in f[0].remedy
