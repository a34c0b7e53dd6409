"""Gradient norms before and after clipping, whoever clips: torch, a monitor, the user by hand.

Every loop here is written the way training scripts are, with torch's functions, and checked
against what those functions returned or against norms computed in the test from the gradients.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_  # bound before any watch exists, as scripts do

import nnwatch
from nnwatch.probe import clip_intercept
from nnwatch.probe.watch import internals
from nnwatch.tensors.torch_clip import global_norm


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch(g: torch.Generator, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 12, generator=g)
    return x, x[:, :4].argmax(dim=1)


def _layer_norms(model: nn.Module) -> dict[str, float]:
    """Per-layer L2 norms of the current gradients, by module name."""
    out: dict[str, float] = {}
    for name, module in model.named_modules():
        grads = [p.grad for p in module.parameters(recurse=False) if p.grad is not None]
        if grads:
            out[name] = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    return out


def _assert_layer_norms_were(run: nnwatch.Run, pre_layers: list[dict[str, float]]) -> None:
    """On every measured step in layers.bin, each per-layer norm is the one in ``pre_layers``."""
    names = run.meta.schema.param_layer_names
    rows = {int(s): r for s, r in zip(run.layers["step"], run.layers["grad_layer"], strict=True)}
    checked = [int(s) for s in np.flatnonzero(run["layer_sums"] == 1.0) if int(s) in rows]
    assert checked  # layers.bin holds the measured steps' per-layer norms
    for step in checked:
        for j, name in enumerate(names):
            assert rows[step][j] == pytest.approx(pre_layers[step][name], rel=1e-5)


def test_torch_clip_with_accumulation_is_recorded_bitwise_on_every_step() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(1)
    returned, pre_layers = [], []
    with nnwatch.watch(model, opt, name="accum-clip", budget=1e-9, max_interval=8) as w:
        for _ in range(120):
            for _micro in range(3):
                x, y = _batch(g)
                (nn.functional.cross_entropy(model(x), y) / 3).backward()
            pre_layers.append(_layer_norms(model))
            returned.append(clip_grad_norm_(model.parameters(), 0.5))
            opt.step()
            opt.zero_grad(set_to_none=True)
            w.step()
    run = nnwatch.load_run(w.run_dir)
    norms = torch.stack(returned).numpy()
    # every step, measured by the budget or not: torch's own value, bit for bit
    assert np.array_equal(run["grad_norm"], norms)
    assert (run["clip_threshold"] == 0.5).all()
    assert np.array_equal(run["clipped"] == 1.0, norms > 0.5)
    assert (norms > 0.5).any() and (norms <= 0.5).any()  # both branches were exercised
    coef = np.minimum(np.float32(0.5) / (norms + np.float32(1e-6)), np.float32(1.0))
    np.testing.assert_allclose(run["grad_norm_clipped"], norms * coef, rtol=1e-6)
    # per-layer norms on measured steps come from the gradients before they were scaled
    measured = np.flatnonzero(run["layer_sums"] == 1.0)
    assert 10 <= len(measured) < 120  # the budget thinned the per-layer work, not the global norm
    _assert_layer_norms_were(run, pre_layers)


def test_a_monitor_threshold_replaces_the_scripts_own_in_torchs_clip() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    with nnwatch.watch(model, opt, name="override") as w:
        for step in range(30):
            if step == 10:
                ok, err, at = internals(w).parts.commands.apply("set_clip", {"max_norm": 0.01})
                assert ok, err
            x, y = _batch(g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
            after = float(global_norm(list(model.parameters())))
            if step >= 10:
                assert after <= 0.01 * (1 + 1e-4)  # the gradients really were clipped at 0.01
                assert float(total) > 0.01
            opt.step()
            w.step()
    run = nnwatch.load_run(w.run_dir)
    assert (run["clip_threshold"][:10] == 100.0).all()
    assert (run["clip_threshold"][10:] == 0.01).all()
    assert (run["clipped"][10:] == 1.0).all()


def test_manual_rescale_records_the_norm_before_and_the_norm_the_update_used() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    pre, post = [], []
    with nnwatch.watch(model, opt, name="by-hand", budget=None) as w:
        for step in range(40):
            limit = 0.3 if step % 2 else 1e3  # every other step rescaled, the others left alone
            x, y = _batch(g)
            opt.zero_grad()
            (nn.functional.cross_entropy(model(x), y) * 5).backward()
            params = [p for p in model.parameters() if p.grad is not None]
            total = torch.sqrt(sum(p.grad.pow(2).sum() for p in params))
            coef = limit / (total + 1e-6)
            if coef < 1:
                for p in params:
                    p.grad.mul_(coef)
            pre.append(float(total))
            post.append(float(global_norm(params)))
            opt.step()
            w.step()
    run = nnwatch.load_run(w.run_dir)
    np.testing.assert_allclose(run["grad_norm"], pre, rtol=1e-5)
    rescaled = (np.arange(40) % 2 == 1) & (np.asarray(pre) > 0.3)
    assert rescaled.sum() >= 10
    np.testing.assert_allclose(run["grad_norm_clipped"][rescaled], np.asarray(post)[rescaled], rtol=1e-5)
    assert (run["clipped"][rescaled] == 1.0).all()
    assert np.isnan(run["clipped"][~rescaled]).all()  # nothing changed the gradients: no clip seen
    assert np.isnan(run["clip_threshold"]).all()  # a rule of the script's own has no threshold we know


def test_clip_by_value_without_an_optimizer_records_the_norm_before_it() -> None:
    """A hand-written SGD update, ``clip_grad_value_``: the norm is the accumulated one."""
    model = _model()
    g = torch.Generator().manual_seed(4)
    pre = []
    with nnwatch.watch(model, None, name="by-value", budget=None) as w:
        for _ in range(25):
            x, y = _batch(g)
            model.zero_grad()
            (nn.functional.cross_entropy(model(x), y) * 50).backward()
            pre.append(float(global_norm(list(model.parameters()))))
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
            w.step()
    run = nnwatch.load_run(w.run_dir)
    np.testing.assert_allclose(run["grad_norm"], pre, rtol=1e-5)
    assert (run["clipped"] == 1.0).all()  # the clamp changed the gradients on every step
    assert (run["grad_norm_clipped"] < run["grad_norm"]).all()
    assert run.meta.schema.num_lr == 0


def test_wrappers_leave_torchs_results_untouched_and_go_away_at_close() -> None:
    model = _model()
    twin = _model()
    g = torch.Generator().manual_seed(5)
    x, y = _batch(g)
    for m in (model, twin):
        nn.functional.cross_entropy(m(x), y).backward()
    original = torch.nn.utils.clip_grad._get_total_norm
    w = nnwatch.watch(model, None, name="wrap")
    assert clip_intercept.installed()
    a = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, foreach=False)
    w.close()
    assert not clip_intercept.installed()
    assert torch.nn.utils.clip_grad._get_total_norm is original
    b = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.1, foreach=False)
    assert torch.equal(a, b)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_a_clip_of_another_models_parameters_is_not_taken_for_this_ones() -> None:
    """A GAN: the generator is watched, the discriminator is clipped; nothing of D is recorded."""
    gen, disc = _model(0), _model(1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(6)
    with nnwatch.watch(gen, opt_g, name="gan", budget=None) as w:
        for _ in range(10):
            x, y = _batch(g)
            disc.zero_grad()
            nn.functional.cross_entropy(disc(x), y).backward()
            torch.nn.utils.clip_grad_norm_(disc.parameters(), 0.01)
            opt_g.zero_grad()
            nn.functional.cross_entropy(gen(x), y).backward()
            expected = float(global_norm(list(gen.parameters())))
            opt_g.step()
            w.step()
    run = nnwatch.load_run(w.run_dir)
    assert run["grad_norm"][-1] == pytest.approx(expected, rel=1e-5)
    assert np.isnan(run["clip_threshold"]).all()


class _ActorCritic(nn.Module):
    """Two heads on one input, each trained and clipped on its own (an RL agent's style)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.actor = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 4))
        self.critic = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 1))


def _actor_critic_loss(agent: _ActorCritic, g: torch.Generator) -> torch.Tensor:
    x, y = _batch(g)
    return nn.functional.cross_entropy(agent.actor(x), y) + agent.critic(x).pow(2).mean()


def test_a_clip_that_also_covers_a_loss_modules_parameters_is_recorded_as_torch_computed_it() -> None:
    """ArcFace-style: the margin head is not part of the watched model but is clipped with it."""
    model = _model()
    head = nn.Linear(4, 4)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.05)
    g = torch.Generator().manual_seed(7)
    returned = []
    with nnwatch.watch(model, opt, name="superset-clip", budget=1e-9, max_interval=8) as w:
        for _ in range(40):
            x, y = _batch(g)
            loss = nn.functional.cross_entropy(head(model(x)), y)
            opt.zero_grad()
            loss.backward()
            returned.append(clip_grad_norm_([*model.parameters(), *head.parameters()], 0.3))
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    norms = torch.stack(returned).numpy()
    assert np.array_equal(run["grad_norm"], norms)  # every step, bit for bit
    assert (run["clip_threshold"] == 0.3).all()
    assert np.array_equal(run["clipped"] == 1.0, norms > 0.3)


@pytest.mark.parametrize("limits", [(0.5, 0.5), (0.5, 2.0)], ids=["one-max-norm", "two-max-norms"])
def test_a_model_clipped_in_parts_is_recorded_as_one_clip_of_the_whole(limits: tuple[float, float]) -> None:
    agent = _ActorCritic()
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(8)
    parts, after, pre_layers = [], [], []
    with nnwatch.watch(agent, opt, name="parts-clip", budget=1e-9, max_interval=8) as w:
        for _ in range(60):
            loss = _actor_critic_loss(agent, g)
            opt.zero_grad()
            loss.backward()
            pre_layers.append(_layer_norms(agent))
            a = clip_grad_norm_(agent.actor.parameters(), limits[0])
            c = clip_grad_norm_(agent.critic.parameters(), limits[1])
            parts.append((float(a), float(c)))
            after.append(float(global_norm(list(agent.parameters()))))
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    a, c = np.array(parts).T
    assert np.isfinite(run["grad_norm"]).all()  # every step, not only the budget's measured ones
    np.testing.assert_allclose(run["grad_norm"], np.hypot(a, c), rtol=1e-6)
    hit = (a > limits[0]) | (c > limits[1])
    assert hit.any() and (~hit).any()  # both outcomes were exercised
    assert np.array_equal(run["clipped"] == 1.0, hit)
    np.testing.assert_allclose(run["grad_norm_clipped"], after, rtol=1e-5)
    if limits[0] == limits[1]:
        assert (run["clip_threshold"] == limits[0]).all()
    else:  # no single threshold to draw against the norm
        assert np.isnan(run["clip_threshold"]).all()
    _assert_layer_norms_were(run, pre_layers)  # both parts, before their clips


def test_a_clip_of_one_part_only_is_not_taken_for_the_whole() -> None:
    agent = _ActorCritic()
    opt = torch.optim.SGD(agent.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(9)
    before = []
    with nnwatch.watch(agent, opt, name="one-part", budget=None) as w:
        for _ in range(10):
            loss = _actor_critic_loss(agent, g)
            opt.zero_grad()
            loss.backward()
            before.append(float(global_norm(list(agent.parameters()))))
            clip_grad_norm_(agent.actor.parameters(), 0.01)
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    # the whole model's norm, measured when backward ended, before the actor's clip
    np.testing.assert_allclose(run["grad_norm"], before, rtol=1e-5)
    assert np.isnan(run["clip_threshold"]).all()


def test_a_clip_by_the_max_norm_records_its_threshold_and_keeps_the_l2_norms() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(10)
    l2, inf_norms = [], []
    with nnwatch.watch(model, opt, name="inf-clip", budget=None) as w:
        for _ in range(20):
            x, y = _batch(g)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            l2.append(float(global_norm(list(model.parameters()))))
            inf_norms.append(float(clip_grad_norm_(model.parameters(), 0.05, norm_type=math.inf)))
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    l2_a, inf_a = np.array(l2), np.array(inf_norms)
    np.testing.assert_allclose(run["grad_norm"], l2_a, rtol=1e-5)  # still the L2 norm
    assert (run["clip_threshold"] == 0.05).all()
    assert np.array_equal(run["clipped"] == 1.0, inf_a > 0.05)
    coef = np.minimum(0.05 / (inf_a + 1e-6), 1.0)
    np.testing.assert_allclose(run["grad_norm_clipped"], l2_a * coef, rtol=1e-5)


@pytest.mark.parametrize("unscaled_first", [False, True])
def test_clip_before_unscale_is_reported_with_its_own_remedy(unscaled_first: bool) -> None:
    """AMP's classic mistake: ``clip_grad_norm_`` before ``scaler.unscale_(opt)`` clips gradients
    still multiplied by the loss scale. The ratio rule alone would advise a 65536x larger
    threshold; the probe sees the scaler's stage and says what is wrong instead, at step 0."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    g = torch.Generator().manual_seed(4)
    returned = []
    with nnwatch.watch(model, opt, scaler, name="amp-clip", budget=None) as w:
        for _ in range(40):
            x, y = _batch(g)
            opt.zero_grad()
            scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
            if unscaled_first:
                scaler.unscale_(opt)
            returned.append(clip_grad_norm_(model.parameters(), 1.0))
            scaler.step(opt)
            scaler.update()
            w.step()
    run = nnwatch.load_run(w.run_dir)
    assert np.array_equal(run["grad_norm"], torch.stack(returned).numpy())  # torch's, as returned
    misuse = [f for f in run.findings if f.get("kind") == "clipping_misuse"]
    if unscaled_first:
        assert misuse == []
        return
    assert len(misuse) == 1 and misuse[0]["step"] == 0  # in events.jsonl though step 0 was unrecorded yet
    assert "scaler.unscale_(optimizer)" in misuse[0]["remedy"]
    assert misuse[0]["evidence"]["loss_scale"] == 2.0**16
    assert run["grad_norm"].min() > 1e3  # scaled indeed: what the ratio rule would have blamed
