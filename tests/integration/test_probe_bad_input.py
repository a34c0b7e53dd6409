"""Bad input never crashes training: each case gets a clear message or graceful handling."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch


def _step(w: nnwatch.Watch, model: nn.Module, x: torch.Tensor, opt=None) -> torch.Tensor:
    if opt is not None:
        opt.zero_grad()
    else:
        model.zero_grad()
    loss = model(x).float().pow(2).mean()
    loss.backward()
    if opt is not None:
        opt.step()
    w.step(loss)
    return loss


def test_a_module_that_owns_parameters_is_a_layer_row_of_its_own() -> None:
    """A hand-written module (``x @ self.w``) is neither Linear nor Conv, but it owns what it
    learns: it gets a row with activation statistics and its gradient norm."""

    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w

    model = Bare()
    with nnwatch.watch(model, name="bare", budget=None) as w:
        for _ in range(3):
            _step(w, model, torch.randn(4, 3))
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 3 and run.layer_names == ("Bare",)
    assert np.all(np.isfinite(run["grad_norm"]))
    assert run.meta.schema.param_layer_names == ("Bare",)
    assert np.isfinite(run.layer_stat("act_std", "Bare")).all()


def test_model_with_no_hookable_layers_warns_and_still_records(caplog: pytest.LogCaptureFixture) -> None:
    class Scaled(nn.Module):
        """Learns nothing itself: it scales its input by a weight it is handed."""

        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x * w

    model = Scaled()
    weight = torch.ones(3, requires_grad=True)
    with caplog.at_level(logging.WARNING, "nnwatch"), nnwatch.watch(model, name="bare") as w:
        for _ in range(3):
            loss = model(torch.randn(4, 3), weight).pow(2).mean()
            loss.backward()
            w.step(loss)
    assert "found no layers to watch in Scaled" in caplog.text
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 3 and run.layer_names == ()
    assert np.isfinite(run["loss"]).all()


def test_non_scalar_loss_is_recorded_as_its_mean_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Linear(3, 1)
    with caplog.at_level(logging.WARNING, "nnwatch"), nnwatch.watch(model, name="vec") as w:
        out = model(torch.randn(5, 3))
        per_sample = out.squeeze(1).pow(2)
        per_sample.mean().backward()
        w.step(per_sample)
    assert "has shape (5,), not a scalar" in caplog.text
    assert nnwatch.load_run(w.run_dir)["loss"][0] == pytest.approx(float(per_sample.detach().mean()), rel=1e-6)


def test_step_twice_is_ignored_and_step_without_backward_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with caplog.at_level(logging.WARNING, "nnwatch"), nnwatch.watch(model, name="twice") as w:
        loss = _step(w, model, torch.randn(2, 3))
        w.step(loss)  # a second call for the same step
        out = model(torch.randn(2, 3)).sum()  # forward only, no backward
        w.step(out)
    assert "called again with no forward or backward pass" in caplog.text
    assert "no backward() since the previous step" in caplog.text
    run = nnwatch.load_run(w.run_dir)
    assert list(run.steps) == [0, 1]
    assert np.isfinite(run["grad_norm"][0]) and np.isnan(run["grad_norm"][1])


def test_non_finite_loss_is_recorded_and_training_goes_on() -> None:
    model = nn.Linear(3, 1)
    with nnwatch.watch(model, name="nanloss", guard=False) as w:
        for v in (1.0, float("nan"), float("inf"), 2.0):
            model.zero_grad()
            loss = model(torch.randn(2, 3)).sum() * 0 + v
            loss.backward()
            w.step(loss)
    loss = nnwatch.load_run(w.run_dir)["loss"]
    assert loss[0] == 1.0 and np.isnan(loss[1]) and np.isinf(loss[2]) and loss[3] == 2.0


def test_modules_returning_tuples_dicts_and_none() -> None:
    class TupleOut(nn.Linear):
        def forward(self, x):  # type: ignore[override]
            return super().forward(x), "extra"

    class DictOut(nn.Linear):
        def forward(self, x):  # type: ignore[override]
            return {"hidden": super().forward(x)}

    class NoneOut(nn.ReLU):
        def forward(self, x):  # type: ignore[override]
            return None

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.t = TupleOut(4, 4)
            self.d = DictOut(4, 4)
            self.n = NoneOut()
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, _ = self.t(x)
            h = self.d(h)["hidden"]
            self.n(h)
            a, _ = self.attn(h.unsqueeze(1), h.unsqueeze(1), h.unsqueeze(1))
            return a.squeeze(1)

    model = Net()
    with nnwatch.watch(model, name="shapes", layer_interval=1) as w:
        for _ in range(2):
            _step(w, model, torch.randn(3, 4))
    run = nnwatch.load_run(w.run_dir)
    idx = {n: i for i, n in enumerate(run.layer_names)}
    row = run.layers[-1]
    for name in ("t", "d", "attn"):
        assert np.isfinite(row["act_mean"][idx[name]]), name
    assert np.isnan(row["act_mean"][idx["n"]])  # None output: absent, not zero


def test_a_failing_layer_probe_is_switched_off_alone(caplog: pytest.LogCaptureFixture) -> None:
    class SparseOut(nn.Linear):
        def forward(self, x):  # type: ignore[override]
            return super().forward(x).to_sparse()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ok = nn.Linear(4, 4)
            self.weird = SparseOut(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weird(self.ok(x)).to_dense()

    model = Net()
    with caplog.at_level(logging.WARNING, "nnwatch"), nnwatch.watch(model, name="weird", layer_interval=1) as w:
        for _ in range(3):
            _step(w, model, torch.randn(2, 4))
    assert "stopped watching layer 'weird'" in caplog.text
    assert caplog.text.count("stopped watching layer") == 1
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 3
    assert np.all(np.isfinite(run.layers["act_mean"][:, run.layer_names.index("ok")]))


def test_model_converted_after_watch_is_followed() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with nnwatch.watch(model, name="dtype", layer_interval=1) as w:
        _step(w, model, torch.randn(2, 3))
        model.double()
        _step(w, model, torch.randn(2, 3, dtype=torch.float64))
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 2 and np.all(np.isfinite(run.layers["act_mean"]))
    assert np.all(np.isfinite(run["grad_norm"]))


@pytest.mark.gpu
def test_model_moved_to_cuda_after_watch_is_followed() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with nnwatch.watch(model, name="move", layer_interval=1) as w:
        _step(w, model, torch.randn(2, 3))
        model.cuda()
        _step(w, model, torch.randn(2, 3, device="cuda"))
        _step(w, model, torch.randn(2, 3, device="cuda"))
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 3 and np.all(np.isfinite(run["grad_norm"]))
    assert np.all(np.isfinite(run["cuda_allocated"][1:]))


def test_unwritable_run_directory_turns_monitoring_off_not_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = nn.Linear(3, 1)
    with caplog.at_level(logging.ERROR, "nnwatch"), nnwatch.watch(model, run_dir=blocker / "run") as w:
        for _ in range(2):
            _step(w, model, torch.randn(2, 3))
    assert w.disabled is not None and "cannot use the run directory" in w.disabled
    assert "training continues without it" in caplog.text
    assert not model._forward_hooks


def test_run_root_that_is_a_symlink_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("NNWATCH_RUN_DIR", str(link))
    w = nnwatch.watch(nn.Linear(2, 2))
    assert w.disabled is not None and "symlink" in w.disabled
    w.close()


def test_import_nnwatch_pulls_in_no_ui_library() -> None:
    code = (
        "import sys, nnwatch, nnwatch.probe.watch, nnwatch.store.runlog, nnwatch.store.schema, nnwatch.tensors.torch_clip\n"
        "import importlib, pkgutil\n"
        "for pkg in ('nnwatch.probe', 'nnwatch.channel', 'nnwatch.diagnosis', 'nnwatch.checks', 'nnwatch.sources'):\n"
        "    mod = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(mod.__path__, pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_two_watches_of_one_name_in_the_same_second_get_their_own_dirs() -> None:
    a = nnwatch.watch(nn.Linear(2, 2), name="twin")
    b = nnwatch.watch(nn.Linear(2, 2), name="twin")
    try:
        assert a.disabled is None and b.disabled is None
        assert a.run_dir != b.run_dir
    finally:
        a.close()
        b.close()


def test_samples_per_second_from_a_dict_batch_of_token_ids() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 1))
    with nnwatch.watch(model, name="tokens") as w:
        for _ in range(3):
            ids = torch.randint(0, 10, (6, 5))
            model.zero_grad()
            loss = model(ids).mean()
            loss.backward()
            w.step(loss, batch={"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    sps = nnwatch.load_run(w.run_dir)["samples_per_sec"]
    assert np.isnan(sps[0]) and np.all(sps[1:] > 0)


def test_reusing_a_run_dir_never_mixes_two_runs(tmp_path: Path) -> None:
    target = tmp_path / "fixed"
    dirs = []
    for _ in range(2):
        model = nn.Linear(3, 1)
        with nnwatch.watch(model, run_dir=target) as w:
            for _ in range(3):
                _step(w, model, torch.randn(2, 3))
        dirs.append(w.run_dir)
    assert dirs == [target, tmp_path / "fixed-2"]
    for d in dirs:
        run = nnwatch.load_run(d)
        assert list(run.steps) == [0, 1, 2] and run.status == "finished"
        assert not (d / "ring").exists()  # a finished run keeps its log, not the 16 MiB ring


def test_a_full_tmpfs_turns_live_monitoring_off_instead_of_killing_training(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    # Docker's default /dev/shm is 64 MiB; a ring that does not fit must not SIGBUS the trainer.
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        code = (
            "import torch, nnwatch\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
            "with nnwatch.watch(m, name='small-shm') as w:\n"
            "    for i in range(20):\n"
            "        m.zero_grad(); l = m(torch.randn(2, 4)).sum(); l.backward(); w.step(l)\n"
            "print('trained', w.step_index, flush=True)\n"
        )
        env = dict(subprocess_env, NNWATCH_RUN_DIR=str(mnt))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "trained 20" in out.stdout
        assert "live monitoring is off" in out.stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("per_micro_batch", [True, False])
def test_w_step_per_micro_batch_is_pointed_out(per_micro_batch: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Gradient accumulation with w.step() after every backward instead of every update: the
    records still come, and the user is told once what a step is to nnwatch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    with caplog.at_level(logging.WARNING, "nnwatch"), nnwatch.watch(model, opt, name="micro") as w:
        for update in range(12):
            for _micro in range(4):
                x = torch.randn(8, 6, generator=g)
                loss = model(x).square().mean() / 4
                loss.backward()
                if per_micro_batch:
                    w.step(loss)
            opt.step()
            opt.zero_grad()
            if not per_micro_batch:
                w.step(loss)
            assert update < 11 or w.step_index == (48 if per_micro_batch else 12)
    said = [r.getMessage() for r in caplog.records if "micro-batch" in r.getMessage()]
    if per_micro_batch:
        assert len(said) == 1 and "w.step() ran 25 of the first 32 times with no optimizer.step()" in said[0]
    else:
        assert said == []
