"""The Hugging Face callback, with a real ``transformers.Trainer`` on a tiny, randomly initialized
BERT built locally (nothing is downloaded).

The Trainer logs its own loss and pre-clip gradient norm every step (``logging_steps=1``); the
run nnwatch recorded must agree with those logs, step by step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import nnwatch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from nnwatch.integrations.transformers import NNWatchCallback  # noqa: E402


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    torch.set_num_threads(1)


class TinyTextData(torch.utils.data.Dataset):
    def __init__(self, n: int = 48, length: int = 12) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, length), generator=g)
        self.labels = (self.ids[:, 0] > 50).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones_like(self.ids[i]),
            "labels": self.labels[i],
        }


def _train(tmp_path: Path, callback: NNWatchCallback, **args: Any) -> Any:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=4, learning_rate=5e-3,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        seed=0, dataloader_num_workers=0, **args,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=targs, train_dataset=TinyTextData(), callbacks=[callback]
    )
    trainer.train()
    return trainer


def _logged(trainer: Any, key: str) -> np.ndarray:
    return np.array(
        [h[key] for h in trainer.state.log_history if key in h and "train_loss" not in h]
    )


def test_each_step_matches_the_trainers_own_logs(tmp_path: Path) -> None:
    cb = NNWatchCallback(name="hf", layer_interval=2)
    trainer = _train(tmp_path, cb, max_steps=6, max_grad_norm=0.05)
    run = nnwatch.load_run(cb.watch.run_dir)

    assert cb.trainer is trainer
    assert run.status == "finished" and len(run) == trainer.state.global_step == 6
    np.testing.assert_allclose(run["loss"], _logged(trainer, "loss"), rtol=1e-5)
    pre = _logged(trainer, "grad_norm")
    np.testing.assert_allclose(run["grad_norm"], pre, rtol=1e-5)
    assert (pre > 0.05).all()  # the clip bit on every step ...
    np.testing.assert_allclose(run["grad_norm_clipped"], 0.05, rtol=1e-4)  # ... down to 0.05
    assert (run["clipped"] == 1.0).all() and (run["clip_threshold"] == np.float64(0.05)).all()
    # per-layer norms are rebased to before the clip: they add up (in squares) to the total
    layers = run.layers["grad_layer"].astype(np.float64)
    np.testing.assert_allclose(
        np.sqrt((layers**2).sum(axis=1)), run["grad_norm"][run.layers["step"]], rtol=1e-4
    )
    np.testing.assert_allclose(run["lr"][:, 0], _logged(trainer, "learning_rate"), rtol=1e-6)
    assert "encoder" in " ".join(run.meta.schema.layer_names)
    # the Trainer is left exactly as it was
    assert "training_step" not in vars(trainer)
    assert "clip_grad_norm_" not in vars(trainer.accelerator)


def test_gradient_accumulation_records_optimizer_steps(tmp_path: Path) -> None:
    cb = NNWatchCallback(name="hf-accum")
    trainer = _train(tmp_path, cb, max_steps=4, gradient_accumulation_steps=2, max_grad_norm=0.0)
    run = nnwatch.load_run(cb.watch.run_dir)

    assert len(run) == trainer.state.global_step == 4
    np.testing.assert_allclose(run["loss"], _logged(trainer, "loss"), rtol=1e-5)
    np.testing.assert_allclose(run["grad_norm"], _logged(trainer, "grad_norm"), rtol=1e-5)
    assert np.isnan(run["grad_norm_clipped"]).all()  # max_grad_norm=0: no clipping
    assert np.isfinite(run["step_time"][1:]).all() and (run["step_time"][1:] > 0).all()
