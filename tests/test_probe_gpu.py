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
