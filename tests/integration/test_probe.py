"""The probe records what a real training loop did, exactly, and absent things stay absent."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.probe import scaler_discovery
from nnwatch.probe.activation_stats import stats_reference, write_stats
from nnwatch.probe.watch import internals


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 3))


def _train(w: nnwatch.Watch, model: nn.Module, opt: torch.optim.Optimizer, steps: int, clip=None):
    losses, norms = [], []
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(10, 12, generator=g)
        y = torch.randint(0, 3, (10,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            norms.append(w.clip_grad_norm_(max_norm=clip).clone())
        opt.step()
        w.step(loss, batch=(x, y))
        losses.append(loss.detach().clone())
    return losses, norms


def test_records_match_the_training_loop_bit_for_bit() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, num_classes=3, name="exact", layer_interval=1) as w:
        losses, norms = _train(w, model, opt, 6, clip=0.25)
    run = nnwatch.load_run(w.run_dir)
    assert run.status == "finished"
    assert list(run.steps) == list(range(6))
    assert np.array_equal(run["loss"], np.array([float(v) for v in losses], dtype=np.float32))
    assert np.array_equal(run["grad_norm"], np.array([float(n) for n in norms], dtype=np.float32))
    assert np.all(run["clip_threshold"] == 0.25)
    fired = run["grad_norm"] > 0.25
    assert np.array_equal(run["clipped"] == 1.0, fired)
    post = run["grad_norm_clipped"]
    assert np.allclose(post[fired], 0.25, rtol=1e-4)
    assert np.allclose(post[~fired], run["grad_norm"][~fired], rtol=1e-5)
    assert np.all(run["lr"][:, 0] == 0.1)
    assert np.all(run["samples_per_sec"][1:] > 0)
    # no scaler and no CUDA: absent, never zero
    assert np.all(np.isnan(run["amp_scale"]))
    assert np.all(np.isnan(run["cuda_allocated"]))


def test_per_layer_stats_match_a_reference_on_the_last_step() -> None:
    model = _mlp()
    outputs: dict[str, torch.Tensor] = {}
    for name, mod in model.named_modules():
        if name:
            mod.register_forward_hook(lambda m, i, o, name=name: outputs.__setitem__(name, o.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, name="stats", layer_interval=1) as w:
        _train(w, model, opt, 3)
    run = nnwatch.load_run(w.run_dir)
    assert run.layer_names == ("0", "1", "2", "3", "4")
    last = run.layers[-1]
    assert last["step"] == 2
    for i, name in enumerate(run.layer_names):
        ref = stats_reference(outputs[name])
        got = [last[f][i] for f in ("act_mean", "act_std", "act_zero", "act_nonfinite", "act_maxabs")]
        assert got == pytest.approx(ref, rel=1e-4, abs=1e-5), name
    relu = run.layer_names.index("1")
    assert 0.2 < last["act_zero"][relu] < 0.8  # a live ReLU zeroes part of its outputs
    # per-layer grad norms fold into the global norm
    g = run.layers["grad_layer"][-1]
    assert math.isclose(float(np.sqrt((g.astype(np.float64) ** 2).sum())), float(run["grad_norm"][-1]), rel_tol=1e-5)


def test_layer_stats_are_sampled_every_n_steps_and_absent_between() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, name="interval", layer_interval=4) as w:
        _train(w, model, opt, 9)
    run = nnwatch.load_run(w.run_dir)
    assert list(run.layers["step"]) == [0, 4, 8]
    assert list(run["layer_stats"]) == [1, 0, 0, 0, 1, 0, 0, 0, 1]


def test_layers_are_named_in_forward_order_not_definition_order() -> None:
    class Backwards(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.last = nn.Linear(8, 2)
            self.first = nn.Linear(4, 8)
            self.act = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(self.act(self.first(x)))

    model = Backwards()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, name="order", layer_interval=1) as w:
        for _ in range(2):
            opt.zero_grad()
            out = model(torch.randn(5, 4))
            out.sum().backward()
            opt.step()
            w.step(out.sum())
    run = nnwatch.load_run(w.run_dir)
    assert run.layer_names == ("first", "act", "last")
    assert run.meta.schema.layer_kinds == ("Linear", "ReLU", "Linear")
    # the ReLU output is never negative: its mean must be >= 0 in the ReLU slot, wherever it sits
    assert np.all(run.layers["act_mean"][:, 1] >= 0)


def test_nan_in_one_layer_shows_in_that_layers_sum_on_an_unsampled_step() -> None:
    class Poison(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.c = nn.Linear(4, 1)
            self.poison = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            h = self.b(h)
            if self.poison:
                h = torch.log(h - 100)  # NaN appears in b's consumer; b's own output is fine
            return self.c(h)

    model = Poison()
    with nnwatch.watch(model, name="poison", layer_interval=100, guard=False) as w:
        for i in range(3):
            model.poison = i == 2
            out = model(torch.randn(3, 4)).sum()
            out.backward()
            w.step(out)
    run = nnwatch.load_run(w.run_dir)
    sums = run.layers["act_sum"]
    steps = list(run.layers["step"])
    assert steps == [0, 2]  # step 2 is logged because it held a non-finite value
    bad = ~np.isfinite(sums[1])
    assert list(bad) == [False, False, True]  # c is the first layer whose output is non-finite
    assert math.isnan(run["loss"][2])
    assert run["nonfinite_grads"][2] == 1.0


def test_watch_without_optimizer_scaler_or_classes_records_what_it_can() -> None:
    model = _mlp()
    with nnwatch.watch(model) as w:
        for _ in range(3):
            model.zero_grad()
            loss = model(torch.randn(4, 12)).pow(2).mean()
            loss.backward()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert run["lr"].shape == (3, 0)
    assert np.all(np.isfinite(run["grad_norm"]))
    assert np.all(np.isnan(run["clip_threshold"]))
    assert np.all(np.isnan(run["samples_per_sec"]))  # no batch given
    assert run.meta.num_classes is None


def test_amp_scale_is_read_without_get_scale_and_skips_are_seen() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=1000)
    with nnwatch.watch(model, opt, scaler, name="amp") as w:
        for i in range(4):
            opt.zero_grad()
            loss = model(torch.randn(4, 12)).pow(2).mean()
            if i == 2:
                loss = loss * float("inf")  # poison one step: the scaler must skip it
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert list(run["amp_scale"]) == [2.0**16, 2.0**16, 2.0**15, 2.0**15]
    assert list(run["amp_skipped"]) == [0.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("passed", [True, False])
def test_amp_norms_are_unscaled_whether_or_not_the_scaler_was_passed(
    passed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop with ``scaler.scale(loss).backward()`` and no clip: the norm measured when backward
    ends is divided by the loss scale. A scaler left out of watch() is found at its first
    ``scale()`` call (before, the grad norm showed 65536 times the true one)."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    true = []
    g = torch.Generator().manual_seed(3)
    with caplog.at_level(logging.WARNING, "nnwatch"):
        with nnwatch.watch(model, opt, scaler if passed else None, name="amp-found", budget=None) as w:
            assert scaler_discovery.installed() != passed
            for _ in range(6):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(torch.randn(8, 12, generator=g)).float().pow(2).mean()
                scaler.scale(loss).backward()
                scale = float(scaler._scale)  # type: ignore[arg-type]
                true.append(float(torch.stack([p.grad.double().norm() for p in model.parameters()]).norm()) / scale)
                scaler.step(opt)
                scaler.update()
                w.step(loss)
            assert internals(w).parts.grads.scaler is scaler
        assert not scaler_discovery.installed()  # GradScaler.scale is torch's own again
    run = nnwatch.load_run(w.run_dir)
    np.testing.assert_allclose(run["grad_norm"], true, rtol=1e-5)
    assert (run["amp_scale"] == 2.0**16).all()
    found = "GradScaler that was not passed to watch()" in caplog.text
    assert found != passed
    assert not hasattr(torch.amp.GradScaler.scale, "__wrapped__")


def test_a_disabled_scaler_is_not_taken_up(caplog: pytest.LogCaptureFixture) -> None:
    """``GradScaler(enabled=args.amp)`` with AMP off scales nothing: nothing to say or unscale."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with caplog.at_level(logging.WARNING, "nnwatch"), nnwatch.watch(model, opt, name="amp-off") as w:
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(model(torch.randn(4, 12)).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
            w.step()
        assert internals(w).parts.grads.scaler is None and scaler_discovery.installed()  # still waiting for a real one
    assert "GradScaler" not in caplog.text and not scaler_discovery.installed()


def test_close_leaves_the_model_as_it_was_and_it_can_be_watched_again() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def hook_state(m: nn.Module) -> list:
        return [
            (sorted(vars(s).keys()), len(s._forward_hooks), len(s._forward_pre_hooks), len(s._backward_hooks))
            for s in m.modules()
        ]

    before = hook_state(model)
    params_before = [p._post_accumulate_grad_hooks for p in model.parameters()]
    opt_hooks_before = len(opt._optimizer_step_pre_hooks)
    for round_ in range(2):
        with nnwatch.watch(model, opt, name=f"again{round_}") as w:
            _train(w, model, opt, 2)
        assert hook_state(model) == before
        assert [p._post_accumulate_grad_hooks for p in model.parameters()] == params_before
        assert len(opt._optimizer_step_pre_hooks) == opt_hooks_before
        assert len(nnwatch.load_run(w.run_dir)) == 2


def test_write_stats_matches_reference_with_nan_inf_and_zeros() -> None:
    x = torch.randn(1000)
    x[:300] = 0.0
    col = torch.zeros(5)
    write_stats(x, col, cap=10_000)
    assert col.tolist() == pytest.approx(stats_reference(x), rel=1e-4, abs=1e-6)
    x[5], x[7], x[9] = float("nan"), float("inf"), float("-inf")
    write_stats(x, col, cap=10_000)
    assert col[3].item() == 3.0  # the non-finite count is exact
    half = torch.randn(64, 32).half()
    write_stats(half, col, cap=10_000)
    assert col.tolist() == pytest.approx(stats_reference(half), rel=1e-3, abs=1e-4)


@pytest.mark.parametrize("branch_free", [False, True], ids=["cpu-path", "gpu-path-on-cpu"])
def test_stat_block_over_several_layers_matches_reference(branch_free: bool) -> None:
    """Both reduction paths (the CPU one, and the branch-free one GPUs run, here on CPU tensors),
    over layers of mixed size, dtype and layout, with one layer not called this step."""
    from nnwatch.probe.activation_stats import StatBlock

    g = torch.Generator().manual_seed(0)
    relu = torch.relu(torch.randn(64, 300, generator=g))  # within the cap, with exact zeros
    wide = torch.randn(2, 50, 40, generator=g).transpose(1, 2)  # non-contiguous
    bad = torch.randn(500, generator=g)
    bad[[3, 30, 300]] = torch.tensor([math.nan, math.inf, -math.inf])
    big = torch.randn(40_000, generator=g).bfloat16()  # past the cap: its first 30,000 values
    block = StatBlock(5, torch.device("cpu"), cap=30_000)
    if branch_free:
        block._on_cpu = False
    for slot, x in ((0, relu), (1, wide), (3, bad), (4, big)):  # slot 2: a layer not called
        block.add(x, slot)
    out = torch.full((5, 5), -7.0)
    assert block.finish(out)
    for slot, x in ((0, relu), (1, wide), (4, big.reshape(-1)[:30_000])):
        assert out[:, slot].tolist() == pytest.approx(stats_reference(x), rel=2e-3, abs=1e-4), slot
    assert out[3, 3].item() == 3.0 and out[2, 3].item() == pytest.approx(0.0)  # 3 non-finite, no zero
    assert out[:, 2].tolist() == [-7.0] * 5  # an absent layer's column is left alone
    assert not block.finish(out)  # nothing was added since: nothing written


def test_stats_cap_bounds_the_elements_read() -> None:
    x = torch.cat([torch.zeros(100), torch.ones(100)])
    col = torch.zeros(5)
    write_stats(x, col, cap=100)
    assert col[2].item() == 1.0  # only the zero prefix was read


def test_learning_rates_of_any_kind_are_recorded_and_never_stop_the_probe(tmp_path) -> None:
    """The host block and the LRs are packed in one call: an LR that is a CPU tensor is read, an
    LR that is not a number is NaN (the probe stays on), and a group added later is left out."""
    model = _mlp()
    first, last = list(model.parameters())[:2], list(model.parameters())[2:]
    opt = torch.optim.SGD([{"params": first, "lr": torch.tensor(0.05)}, {"params": last, "lr": 0.1}])
    g = torch.Generator().manual_seed(1)
    with nnwatch.watch(model, opt, name="lrs", run_dir=tmp_path / "run") as w:
        for step in range(4):
            if step == 3:
                opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))], "lr": 9.0})
            opt.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(10, 12, generator=g)), torch.zeros(10, dtype=torch.long)).backward()
            opt.step()
            if step == 2:
                opt.param_groups[1]["lr"] = "warmup"  # what w.step() reads: not a number
            elif step == 3:
                opt.param_groups[1]["lr"] = np.float64(0.2)  # a float subclass
            w.step()
            opt.param_groups[1]["lr"] = 0.1
        assert w.disabled is None
    run = nnwatch.load_run(w.run_dir)
    assert list(run.steps) == [0, 1, 2, 3]
    lr = run["lr"]
    assert lr.shape == (4, 2)  # the groups the watch started with
    assert np.allclose(lr[:, 0], 0.05)
    assert list(lr[:2, 1]) == [0.1, 0.1] and math.isnan(lr[2, 1]) and lr[3, 1] == 0.2
