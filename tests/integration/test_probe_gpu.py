"""On CUDA the probe's hot path never synchronizes with the device (checked by torch itself)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch

pytestmark = pytest.mark.gpu


def _loop(w: nnwatch.Watch, model: nn.Module, opt, scaler, steps: int, clip: bool) -> None:
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda")
        y = torch.randint(0, 10, (32,), device="cuda")
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if clip:
            w.clip_grad_norm_(max_norm=1.0)
        scaler.step(opt)
        scaler.update()
        w.step(loss, batch=(x, y))


@pytest.mark.parametrize("clip", [False, True])
def test_steady_state_steps_make_no_host_device_sync(clip: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.LayerNorm(128), nn.Linear(128, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    with nnwatch.watch(model, opt, scaler, name="gpu-sync", guard=False, layer_interval=1, channel=False) as w:
        _loop(w, model, opt, scaler, 3, clip)  # warm-up: allocations, cached index tensors
        torch.cuda.synchronize()
        # the scaler itself syncs inside step()/update(): exempt them, watch everything else
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(5):
                x = torch.randn(32, 64, device="cuda")
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(x).float().pow(2).mean()
                scaler.scale(loss).backward()
                if clip:
                    w.clip_grad_norm_(max_norm=1.0)
                torch.cuda.set_sync_debug_mode(0)
                scaler.step(opt)
                scaler.update()
                torch.cuda.set_sync_debug_mode("error")
                w.step(loss, batch=(x,))
        finally:
            torch.cuda.set_sync_debug_mode(0)
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 8
    assert np.all(np.isfinite(run["grad_norm"]))
    assert np.all(np.isfinite(run["amp_scale"]))
    assert np.all(run["cuda_allocated"] > 0)
    assert np.all(np.isfinite(run.layers["act_std"]))


def _fp32_steps_then_checked_steps(w: nnwatch.Watch, model: nn.Module, opt, warm: int, checked: int) -> None:
    """``warm`` plain steps, then ``checked`` more under ``set_sync_debug_mode("error")``."""

    def one() -> None:
        x = torch.randn(32, 64, device="cuda")
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()  # nnwatch measures the gradients in its pre-hook here
        w.step(loss, batch=(x,))

    for _ in range(warm):
        one()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(checked):
            one()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_a_whole_fp32_step_with_the_optimizer_pre_hook_makes_no_sync() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with nnwatch.watch(model, opt, name="gpu-sync-fp32", guard=False, layer_interval=1, channel=False) as w:
        _fp32_steps_then_checked_steps(w, model, opt, 3, 5)
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 8 and np.all(np.isfinite(run["grad_norm"]))


def test_guard_costs_one_sync_and_catches_nonfinite_gradients() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with nnwatch.watch(model, opt, name="gpu-guard", guard=True, skip_nonfinite=True, channel=False) as w:
        before = [p.detach().clone() for p in model.parameters()]
        x = torch.randn(4, 8, device="cuda")
        opt.zero_grad()
        loss = model(x).sum() * float("nan")
        loss.backward()
        opt.step()
        w.step(loss, batch=(x,))
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), b)  # the poisoned step was skipped
    assert (w.run_dir / "snapshots").is_dir()


def test_light_and_measured_steps_under_the_cost_budget_make_no_sync() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    # a budget no step can meet: after the warm-up, every 4th step is measured, the rest are light
    with nnwatch.watch(model, opt, name="gpu-budget", guard=False, budget=1e-9, max_interval=4, channel=False) as w:
        _fp32_steps_then_checked_steps(w, model, opt, 40, 12)
    run = nnwatch.load_run(w.run_dir)
    late = run["layer_sums"][40:]
    assert (late == 1.0).any() and (late == 0.0).any()
    assert np.isnan(run["grad_norm"][40:][late == 0.0]).all()
    assert np.isfinite(run["grad_norm"][40:][late == 1.0]).all()


def test_torchs_own_clip_under_amp_is_seen_bitwise_and_makes_no_sync() -> None:
    """The usual AMP script: unscale_, torch's clip_grad_norm_, scaler.step. nnwatch takes the
    norm torch returned (every step, bit for bit) without a sync of its own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.LayerNorm(128), nn.Linear(128, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    returned = []
    with nnwatch.watch(model, opt, scaler, name="gpu-torch-clip", channel=False, budget=1e-9, max_interval=4) as w:
        for i in range(40):
            x = torch.randn(32, 64, device="cuda")
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            checked = i >= 30
            if checked:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                returned.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05))
            finally:
                torch.cuda.set_sync_debug_mode(0)
            scaler.step(opt)
            scaler.update()
            if checked:
                torch.cuda.set_sync_debug_mode("error")
            try:
                w.step(loss, batch=(x,))
            finally:
                torch.cuda.set_sync_debug_mode(0)
    run = nnwatch.load_run(w.run_dir)
    norms = torch.stack(returned).float().cpu().numpy()
    assert np.array_equal(run["grad_norm"], norms)
    assert (run["clip_threshold"] == 0.05).all()
    assert np.array_equal(run["clipped"] == 1.0, norms > 0.05)


def test_norm_at_the_end_of_backward_is_unscaled_and_a_manual_rescale_makes_no_sync() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    unscaled = []
    with nnwatch.watch(model, opt, scaler, name="gpu-unscale", channel=False, budget=None) as w:
        for _ in range(8):
            x = torch.randn(32, 64, device="cuda")
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()  # nnwatch measures here: scaled gradients
            scaler.unscale_(opt)
            grads = [p.grad for p in model.parameters()]
            unscaled.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
            scaler.step(opt)
            scaler.update()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    np.testing.assert_allclose(run["grad_norm"], unscaled, rtol=1e-4)
    # fp32, a rescale by hand between backward and the update, checked for syncs
    model2 = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    opt2 = torch.optim.SGD(model2.parameters(), lr=1e-3)
    with nnwatch.watch(model2, opt2, name="gpu-rescale", channel=False, guard=False, budget=None) as w2:
        for i in range(10):
            if i == 4:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            x = torch.randn(32, 64, device="cuda")
            opt2.zero_grad(set_to_none=True)
            model2(x).pow(2).mean().backward()
            for p in model2.parameters():
                p.grad.mul_(0.5)
            opt2.step()
            w2.step()
        torch.cuda.set_sync_debug_mode(0)
    run2 = nnwatch.load_run(w2.run_dir)
    np.testing.assert_allclose(run2["grad_norm_clipped"], run2["grad_norm"] * 0.5, rtol=1e-5)
    assert (run2["clipped"] == 1.0).all()


def test_a_model_clipped_in_parts_makes_no_sync_and_is_recorded_as_the_whole() -> None:
    """An actor and a critic clipped each with torch's own call: one record of the whole, no sync."""
    torch.manual_seed(0)
    agent = nn.ModuleDict(
        {"actor": nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4)),
         "critic": nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))}
    ).cuda()
    opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
    parts = []
    with nnwatch.watch(agent, opt, name="gpu-parts-clip", channel=False, budget=1e-9, max_interval=4) as w:
        for i in range(40):
            x = torch.randn(32, 64, device="cuda")
            checked = i >= 30
            if checked:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                opt.zero_grad(set_to_none=True)
                loss = agent["actor"](x).pow(2).mean() + agent["critic"](x).pow(2).mean()
                loss.backward()
                a = torch.nn.utils.clip_grad_norm_(agent["actor"].parameters(), 0.05)
                c = torch.nn.utils.clip_grad_norm_(agent["critic"].parameters(), 0.05)
                parts.append(torch.stack([a, c]))
                opt.step()
                w.step(loss, batch=(x,))
            finally:
                torch.cuda.set_sync_debug_mode(0)
    run = nnwatch.load_run(w.run_dir)
    a, c = torch.stack(parts).double().cpu().numpy().T
    np.testing.assert_allclose(run["grad_norm"], np.hypot(a, c), rtol=1e-6)
    assert (run["clip_threshold"] == 0.05).all()
    assert np.array_equal(run["clipped"] == 1.0, (a > 0.05) | (c > 0.05))
