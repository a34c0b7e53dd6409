"""A watched model lives its normal life: saved whole, copied, pickled, compiled, closed clean.
And every shape of model real code has gets rows: RNNs, hand-written modules, tied weights."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.probe import hook_hiding
from nnwatch.probe.watch import internals
from tests.conftest import PYTHON
from tests.plain_models import TinyLM


def _train_lm(model: TinyLM, w: nnwatch.Watch, steps: int, seq: int = 12, batch: int = 5) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = None
    for _ in range(steps):
        data = torch.randint(0, 30, (seq + 1, batch), generator=g)  # (T, B): sequence first
        x, y = data[:-1], data[1:]
        if hidden is not None:
            hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(x, hidden)
        loss = nn.functional.cross_entropy(out.reshape(-1, 30), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-1.0)
        w.step(loss, batch=(x, y))


def _all_hooks(model: nn.Module) -> list[object]:
    found: list[object] = []
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks"):
            found.extend(getattr(m, attr).values())
    return found


def test_rnn_model_without_optimizer_gets_rows_ties_and_batch_size() -> None:
    model = TinyLM()
    with nnwatch.watch(model, None, name="lstm", budget=None, layer_interval=1) as w:
        _train_lm(model, w, 20)
    run = nnwatch.load_run(w.run_dir)
    names = run.meta.schema.layer_names
    assert {"encoder", "rnn", "norm", "decoder"} <= set(names)
    # the LSTM and the hand-written module have activation statistics of their own
    assert np.isfinite(run.layer_stat("act_std", "rnn")).all()
    assert np.isfinite(run.layer_stat("act_std", "norm")).all()
    # gradient rows: the tied head says whose weight it shares; its own row holds its bias only
    assert run.meta.extra["tied"] == {"decoder": "encoder"}
    assert {"encoder", "rnn", "norm", "decoder"} <= set(run.meta.schema.param_layer_names)
    assert model.decoder.bias.grad is not None
    bias_norm = float(model.decoder.bias.grad.norm())  # after the loop's clip at 0.25
    pre = run.layers["grad_layer"][-1][run.meta.schema.param_layer_names.index("decoder")]
    coef = min(0.25 / (float(run["grad_norm"][-1]) + 1e-6), 1.0)
    assert pre * coef == pytest.approx(bias_norm, rel=1e-5)
    # samples/s counts the 5 sequences of the (T, B) batch, not the 12 time steps
    rate = run["samples_per_sec"][1:] * run["step_time"][1:]
    np.testing.assert_allclose(rate, 5.0, rtol=1e-6)
    assert run.meta.schema.num_lr == 0 and np.isfinite(run["grad_norm"]).all()


def test_batch_size_given_to_step_wins() -> None:
    model = nn.Linear(4, 2)
    with nnwatch.watch(model, None, name="bs") as w:
        for _ in range(3):
            x = torch.randn(6, 4)
            model(x).sum().backward()
            w.step(batch=(x,), batch_size=42)
    run = nnwatch.load_run(w.run_dir)
    np.testing.assert_allclose(run["samples_per_sec"][1:] * run["step_time"][1:], 42.0, rtol=1e-6)


def test_watched_model_saves_copies_and_pickles_without_nnwatch_in_it(tmp_path: Path) -> None:
    model = TinyLM()
    with nnwatch.watch(model, None, name="save") as w:
        _train_lm(model, w, 3)
        assert _all_hooks(model)  # hooked while watched
        torch.save(model, tmp_path / "model.pt")  # crashed before: "Can't pickle local object"
        blob = pickle.dumps(model)
        twin = copy.deepcopy(model)
        assert not _all_hooks(twin)
        assert not _all_hooks(pickle.loads(blob))
        steps = w.step_index
        x = torch.randint(0, 30, (12, 5))
        twin(x)[0].sum().backward()  # an EMA/eval copy's forward and backward report nothing
        assert w.step_index == steps and not internals(w).parts.cycle.step_open
        state = model.state_dict()
        assert all(isinstance(v, torch.Tensor) for v in state.values())
    assert not _all_hooks(model)  # close() leaves no hook behind
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    assert not hook_hiding.wrapped_classes()  # nn.Module's and nn.LSTM's own methods are back
    assert not hasattr(nn.LSTM.__getstate__, "__wrapped__")
    # the saved file loads where nnwatch cannot even be imported
    loader = tmp_path / "load.py"
    loader.write_text(
        "import sys, torch\n"
        "from torch import nn\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'nnwatch' or name.startswith('nnwatch.'):\n"
        "            raise ImportError('nnwatch must not be needed to load the model')\n"
        "sys.meta_path.insert(0, Blocker())\n"
        f"m = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=False)\n"
        "hooks = [h for mod in m.modules() for a in ('_forward_hooks', '_forward_pre_hooks') for h in getattr(mod, a).values()]\n"
        "assert not hooks, hooks\n"
        "assert 'nnwatch' not in sys.modules\n"
        "print('loaded', type(m).__name__)\n"
    )
    done = subprocess.run([PYTHON, str(loader)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "loaded TinyLM" in done.stdout


def test_close_puts_every_torch_function_back() -> None:
    saved = nn.Module.__getstate__
    clip = torch.nn.utils.clip_grad._get_total_norm
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    w = nnwatch.watch(model, None, name="restore")
    assert nn.Module.__getstate__ is not saved
    w2 = nnwatch.watch(nn.Linear(2, 2), None, name="restore-2")
    w.close()
    assert nn.Module.__getstate__ is not saved  # the second watch still needs it
    w2.close()
    assert nn.Module.__getstate__ is saved
    assert torch.nn.utils.clip_grad._get_total_norm is clip
    buf = io.BytesIO()
    torch.save(model, buf)  # and a plain model still saves


def test_compiled_model_trains_and_is_recorded() -> None:
    pytest.importorskip("torch._dynamo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwatch.watch(model, opt, name="compiled", budget=None) as w:
        compiled = torch.compile(model, backend="eager")
        for _ in range(6):
            x = torch.randn(4, 8)
            opt.zero_grad()
            loss = compiled(x).pow(2).mean()
            loss.backward()
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
            w.step(loss)
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 6
    assert np.isfinite(run["loss"]).all()
    assert run["grad_norm"][-1] == np.float32(float(total))


def test_a_climbing_loss_is_measured_on_every_step_while_it_climbs() -> None:
    """No NaN, no spike: the loss just climbs. The budget must stop thinning measurements."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    with nnwatch.watch(model, opt, name="climb", budget=1e-9, max_interval=16) as w:
        for step in range(220):
            x = torch.randn(32, 12, generator=g)
            y = x[:, :3].argmax(dim=1)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            if step >= 120:
                loss = loss * (1.0 + 0.05 * (step - 120))  # a steady climb, 5% of the start per step
            loss.backward()
            opt.step()
            w.step(loss)
    measured = nnwatch.load_run(w.run_dir)["layer_sums"] == 1.0
    assert measured[60:120].mean() < 0.3  # healthy: thinned
    assert measured[135:220].all()  # climbing: every step, within 15 steps of the onset


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch, run_root: Path) -> None:
    monkeypatch.setenv("NNWATCH_DISABLE", "1")
    model = nn.Linear(3, 1)
    with nnwatch.watch(model, None, name="off") as w:
        model(torch.randn(2, 3)).sum().backward()
        w.step()
    assert w.disabled and not _all_hooks(model)
    assert not list((run_root).glob("runs/off-*"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_layer_names_drop_the_wrappers_prefixes() -> None:
    from nnwatch.tensors.layers import plan_layers, strip_wrapper_prefixes

    inner = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    compiled = torch.compile(inner, backend="eager")
    assert plan_layers(compiled).stat_names == ("0", "1")  # not "_orig_mod.0"
    dp = nn.DataParallel(inner)
    assert plan_layers(dp).stat_names == ("0", "1")  # not "module.0"
    assert strip_wrapper_prefixes("layers.0._fsdp_wrapped_module.attn") == "layers.0.attn"
    assert strip_wrapper_prefixes("module.fc") == "module.fc"  # a layer of the model named module
    both = torch.compile(nn.DataParallel(inner), backend="eager")
    assert plan_layers(both).stat_names == ("0", "1")  # not "module.0" under compile(DP(m))

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)  # the user's own attribute named "module" stays

    assert plan_layers(Holder()).stat_names == ("module",)


def test_lazy_modules_are_watched_once_their_first_forward_sized_them(tmp_path: Path) -> None:
    """``nn.LazyLinear`` has no parameter sizes before its first forward (and its uninitialized
    parameters take no hook); watch() used to fail on it. Every step is recorded from step 0."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.LazyLinear(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    returned = []
    with nnwatch.watch(model, opt, name="lazy", budget=None) as w:
        for _ in range(12):
            x = torch.randn(16, 10, generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), x[:, :3].argmax(1))
            loss.backward()
            returned.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
            opt.step()
            w.step(loss)
        assert internals(w).parts.guard.sentinels and internals(w).parts.guard.sentinels[0] is model[0].bias
    run = nnwatch.load_run(w.run_dir)
    np.testing.assert_array_equal(run["grad_norm"], torch.stack(returned).numpy())
    assert run.meta.schema.param_layer_names == ("0", "2")
    assert np.isfinite(run.layers["grad_layer"]).all()
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    assert not _all_hooks(model)
    torch.save(model, tmp_path / "lazy.pt")
