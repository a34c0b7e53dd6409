"""The Lightning callback, with a real ``lightning.Trainer`` on a tiny model on the CPU.

What is checked against Lightning itself: one record per optimizer step; the loss it recorded is
the one ``training_step`` returned; the gradient norm before clipping is the one the module sees in
its own ``on_before_optimizer_step``; the norm after Lightning's clipping is the one the SGD update
actually applied (read back from the parameter change); a monitor lists the run while it trains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch

L = pytest.importorskip("lightning")
from nnwatch.integrations.lightning import NNWatch  # noqa: E402

LR = 0.1


class TinyModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        self.losses: list[float] = []
        self.pre_norms: list[float] = []
        self.post_norms: list[float] = []
        self.seen_by_monitor: list[str] = []
        self._before: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y) * 5.0  # big gradients, so clips bite
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._before = [p.detach().clone() for p in self.parameters()]

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.pre_norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        after = list(self.parameters())
        if any(not torch.equal(a, b) for a, b in zip(after, self._before, strict=True)):
            delta = [(b - a.detach()) / LR for a, b in zip(after, self._before, strict=True)]
            self.post_norms.append(
                float(torch.linalg.vector_norm(torch.cat([d.reshape(-1) for d in delta])))
            )
        if batch_idx == 3:
            from nnwatch.store.registry import list_runs

            self.seen_by_monitor = [r.state for r in list_runs()]


class CustomClip(TinyModule):
    """A user's own clipping rule (Lightning then calls this instead of clipping by itself)."""

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None) -> None:  # fmt: skip
        torch.nn.utils.clip_grad_norm_(self.parameters(), 0.2)


def _data(n: int = 64) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _fit(module: TinyModule, callback: NNWatch, **trainer_args: Any) -> L.Trainer:
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        **trainer_args,
    )  # fmt: skip
    trainer.fit(module, _data())
    return trainer


def test_each_optimizer_step_is_recorded_with_the_norms_around_lightnings_clip() -> None:
    torch.set_num_threads(1)
    module, cb = TinyModule(), NNWatch(name="lit", layer_interval=2)
    trainer = _fit(module, cb, gradient_clip_val=0.5)
    run = nnwatch.load_run(cb.watch.run_dir)

    assert run.status == "finished" and len(run) == trainer.global_step == 8
    np.testing.assert_allclose(run["loss"], module.losses, rtol=1e-6)
    np.testing.assert_allclose(run["grad_norm"], module.pre_norms, rtol=1e-5)
    np.testing.assert_allclose(run["grad_norm_clipped"], module.post_norms, rtol=1e-4)
    assert (run["grad_norm"] > 0.5).all()  # every step clipped ...
    np.testing.assert_allclose(run["grad_norm_clipped"], 0.5, rtol=1e-4)  # ... down to 0.5
    assert (run["clipped"] == 1.0).all() and (run["clip_threshold"] == 0.5).all()
    np.testing.assert_allclose(run["lr"][:, 0], LR)
    assert np.isfinite(run.layers["grad_layer"]).all()
    assert "running" in module.seen_by_monitor  # `nnwatch ls` saw it while it trained
    end = json.loads((Path(run.run_dir) / "end.json").read_text())
    assert end["status"] == "finished" and end["steps"] == 8
    assert "configure_gradient_clipping" not in module.__dict__  # the wrapper is gone


def test_gradient_accumulation_and_a_custom_clip() -> None:
    torch.set_num_threads(1)
    module, cb = CustomClip(), NNWatch(name="lit-accum")
    trainer = _fit(module, cb, accumulate_grad_batches=2)
    run = nnwatch.load_run(cb.watch.run_dir)

    assert len(run) == trainer.global_step == 4  # 8 batches, one record per optimizer step
    pairs = np.asarray(module.losses).reshape(4, 2).mean(axis=1)
    np.testing.assert_allclose(run["loss"], pairs, rtol=1e-6)
    np.testing.assert_allclose(run["grad_norm"], module.pre_norms, rtol=1e-5)
    np.testing.assert_allclose(run["grad_norm_clipped"], module.post_norms, rtol=1e-4)
    assert (run["grad_norm_clipped"] <= 0.2 + 1e-5).all()
    # the custom rule clips with torch's clip_grad_norm_, which nnwatch sees: its threshold too
    assert (run["clip_threshold"] == 0.2).all()
    assert (run["clipped"] == (run["grad_norm_clipped"] < run["grad_norm"])).all()


def test_without_clipping_nothing_extra_is_measured() -> None:
    torch.set_num_threads(1)
    module, cb = TinyModule(), NNWatch(name="lit-noclip")
    _fit(module, cb, limit_train_batches=3)
    run = nnwatch.load_run(cb.watch.run_dir)
    assert len(run) == 3
    np.testing.assert_allclose(run["grad_norm"], module.pre_norms, rtol=1e-5)
    assert np.isnan(run["grad_norm_clipped"]).all() and np.isnan(run["clipped"]).all()


def test_a_crash_in_training_is_recorded_as_crashed() -> None:
    class Boom(TinyModule):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 2:
                raise RuntimeError("bad batch")
            return super().training_step(batch, batch_idx)

    torch.set_num_threads(1)
    cb = NNWatch(name="lit-crash")
    with pytest.raises(RuntimeError, match="bad batch"):
        _fit(Boom(), cb)
    run = nnwatch.load_run(cb.watch.run_dir)
    assert run.status == "crashed" and len(run) == 2
    assert any(e.get("type") == "error" and "bad batch" in e["error"] for e in run.events)


def test_the_recorded_lr_is_the_one_the_update_used() -> None:
    class Scheduled(TinyModule):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=LR)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5**k)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    torch.set_num_threads(1)
    module, cb = Scheduled(), NNWatch(name="lit-lr")
    _fit(module, cb, limit_train_batches=4)
    run = nnwatch.load_run(cb.watch.run_dir)
    np.testing.assert_allclose(run["lr"][:, 0], LR * 0.5 ** np.arange(4))
    assert module.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(LR * 0.5**4)
