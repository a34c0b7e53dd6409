"""TensorBoard export, read back with TensorBoard's own EventAccumulator.

The live export (``watch(..., tensorboard=DIR)``) and the offline one (``nnwatch export
tensorboard``) must write the same tags and values, straight from the records, with no extra hook.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nnwatch
from nnwatch.export import TensorBoard, export_run
from nnwatch.probe.watch import internals
from nnwatch.store.finding import Finding
from tests.conftest import REPO

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

STEPS = 25
LAYER_INTERVAL = 5


def _accumulator(path: Path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def _train(tmp_path: Path, **options: object) -> nnwatch.Watch:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    opt = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "lr": 0.05},
            {"params": model[2].parameters(), "lr": 0.01},
        ]
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    with nnwatch.watch(
        model, opt, scaler, name="tb", layer_interval=LAYER_INTERVAL, **options
    ) as w:
        for i in range(STEPS):
            x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            w.clip_grad_norm_(max_norm=0.3)
            scaler.step(opt)
            scaler.update()
            sched.step()
            w.step(loss, batch=(x, y))
            if i == 12:
                internals(w).findings.add(
                    Finding("loss_stalled", "warning", i, "made up for the test.", "none")
                )
    return w


def test_live_export_matches_the_records_and_the_offline_export(tmp_path: Path) -> None:
    live_dir = tmp_path / "live"
    w = _train(tmp_path, tensorboard=TensorBoard(live_dir, histogram_every=10))
    run = nnwatch.load_run(w.run_dir)
    live = _accumulator(live_dir / w.run_dir.name)

    # scalars: every step, same float32 values as the run log
    loss = live.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(STEPS))
    np.testing.assert_array_equal(np.float32([e.value for e in loss]), np.float32(run["loss"]))
    pre = np.float32([e.value for e in live.Scalars("grad/norm")])
    post = np.float32([e.value for e in live.Scalars("grad/norm_clipped")])
    np.testing.assert_array_equal(pre, np.float32(run["grad_norm"]))
    np.testing.assert_array_equal(post, np.float32(run["grad_norm_clipped"]))  # TensorBoard keeps float32
    assert (post <= pre + 1e-6).all() and (post < pre).any()  # clipping did bite
    lr1 = [e.value for e in live.Scalars("train/lr/group1")]
    assert lr1[0] == pytest.approx(0.01) and lr1[-1] == pytest.approx(0.0025)
    assert live.Scalars("amp/scale")[0].value == pytest.approx(256.0)
    assert [e.value for e in live.Scalars("grad/clip_threshold")] == [pytest.approx(0.3)] * STEPS
    # wall time is the record's, not the export's
    assert live.Scalars("train/loss")[3].wall_time == pytest.approx(float(run["time"][3]), abs=1e-3)

    # per-layer stats only on sampled steps; histograms every 10 steps
    tags = live.Tags()
    layer = run.meta.schema.layer_names[0]
    assert [e.step for e in live.Scalars(f"act_std/{layer}")] == list(
        range(0, STEPS, LAYER_INTERVAL)
    )
    for name in run.meta.schema.param_layer_names:
        assert f"grad_layer/{name}" in tags["scalars"]
    assert "hist/grad_layer_log10" in tags["histograms"]
    assert [e.step for e in live.Histograms("hist/act_std")] == [0, 10, 20]
    hist = live.Histograms("hist/grad_layer_log10")[0].histogram_value
    assert hist.num == len(run.meta.schema.param_layer_names)

    # the finding arrives as text
    assert "findings/text_summary" in tags["tensors"]
    text = live.Tensors("findings/text_summary")[0]
    assert text.step == 12 and b"loss_stalled" in text.tensor_proto.string_val[0]

    # offline export of the same run: same tags and values
    offline_root = tmp_path / "offline"
    summary = export_run(w.run_dir, offline_root, histogram_every=10)
    assert summary.steps == STEPS and summary.findings == 1
    offline = _accumulator(offline_root / w.run_dir.name)
    assert sorted(offline.Tags()["scalars"]) == sorted(tags["scalars"])
    assert sorted(offline.Tags()["histograms"]) == sorted(tags["histograms"])
    for tag in ("train/loss", "grad/norm", f"act_mean/{layer}", "train/lr/group0"):
        a = [(e.step, e.value) for e in live.Scalars(tag)]
        b = [(e.step, e.value) for e in offline.Scalars(tag)]
        assert a == b, tag


def test_the_live_export_adds_no_hook(tmp_path: Path) -> None:
    def hooks(m: nn.Module) -> int:
        return sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules())

    counts = []
    for tb in (None, tmp_path / "tb"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        with nnwatch.watch(model, name=f"hooks-{tb is None}", tensorboard=tb) as w:
            counts.append(hooks(model))
            model(torch.randn(2, 4)).sum().backward()
            w.step()
            if tb is not None:
                assert any(getattr(o, "__self__", None) is internals(w).files.exporter for o in internals(w).files.log.observers)
    assert counts[0] == counts[1] > 0


def test_measured_nan_is_left_out_not_written(tmp_path: Path) -> None:
    model = nn.Linear(3, 1)
    with nnwatch.watch(model, name="plain", tensorboard=tmp_path / "tb") as w:
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            w.step()  # no loss, no clip, no optimizer
    acc = _accumulator(tmp_path / "tb" / w.run_dir.name)
    scalars = acc.Tags()["scalars"]
    assert "grad/norm" in scalars
    assert "train/loss" not in scalars and "grad/norm_clipped" not in scalars
    assert all(np.isfinite(e.value) for t in scalars for e in acc.Scalars(t))


def test_a_broken_export_target_leaves_training_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the log directory should be")
    model = nn.Linear(3, 1)
    with nnwatch.watch(model, name="broken", tensorboard=blocker) as w:
        for _ in range(4):
            model(torch.randn(2, 3)).sum().backward()
            w.step()
    assert w.disabled is None and internals(w).files.exporter is None
    assert len(nnwatch.load_run(w.run_dir)) == 4
    assert "TensorBoard export is off" in caplog.text


def test_cli_export_refuses_to_duplicate_and_explains(
    tmp_path: Path, subprocess_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from nnwatch.cli import main

    w = _train(tmp_path)
    out = tmp_path / "cli"
    args = ["export", "tensorboard", str(w.run_dir), str(out)]
    first = subprocess.run(
        [sys.executable, "-m", "nnwatch", *args],
        cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert f"{STEPS} steps" in first.stdout and "tensorboard --logdir" in first.stdout
    capsys.readouterr()
    assert main(args) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--histogram-every", "0"]) == 0
    files = list((out / w.run_dir.name).glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = _accumulator(out / w.run_dir.name)
    assert len(acc.Scalars("train/loss")) == STEPS and not acc.Tags()["histograms"]
    capsys.readouterr()
    assert main(["export", "tensorboard", str(tmp_path / "nope"), str(out)]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_importing_nnwatch_pulls_in_no_framework(subprocess_env: dict[str, str]) -> None:
    code = (
        "import sys, nnwatch, nnwatch.probe.watch, nnwatch.export, nnwatch.store.jobs, "
        "nnwatch.integrations, nnwatch.cli.export\n"
        "heavy = ('tensorboard', 'torch.utils.tensorboard', 'lightning', 'pytorch_lightning', "
        "'transformers', 'accelerate')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_event_framing_uses_tensorboards_checksum() -> None:
    import os

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference

    from nnwatch.export.event_file import masked_crc32c

    for n in (0, 1, 7, 8, 400, 4097):
        data = os.urandom(n)
        assert masked_crc32c(data) == reference(data)
