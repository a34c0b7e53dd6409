"""inspect_batch: normalization verdicts per channel, label histograms and decoded samples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from nnwatch.checks import CheckError, inspect_batch  # noqa: E402
from tests.fixtures import check_factories as F  # noqa: E402


def _images(gen: torch.Generator, n: int = 64, scale: float = 1.0) -> torch.Tensor:
    """(N, 3, 8, 8) images in [0, scale] with different per-channel brightness."""
    base = torch.rand(n, 3, 8, 8, generator=gen)
    return base * torch.tensor([0.5, 0.8, 1.0]).view(1, 3, 1, 1) * scale


def test_healthy_digits_batch():
    x, y = F.digits(64)
    r = inspect_batch((x, y), num_classes=10)
    assert r.passed and r.verdict == "OK" and r.normalized
    assert len(r.channel_mean) == 64  # features are the channels of an (N, F) batch
    assert abs(r.mean) < 0.1 and abs(r.std - 1) < 0.1
    assert sum(r.label_counts.values()) == 64 and len(r.label_counts) == 10
    assert r.balanced
    assert r.summary() == f"inputs mean {r.mean:.2f} std {r.std:.2f}; 10 classes balanced"


def test_raw_pixels_fail():
    x, y = F.digits(64, normalized=False)
    r = inspect_batch((x, y))
    assert not r.passed and r.verdict == "NOT NORMALIZED" and r.normalized is False
    assert r.causes[0].startswith("inputs are not normalized")


def test_per_channel_stats_of_images():
    gen = torch.Generator().manual_seed(0)
    x = _images(gen)
    y = torch.arange(64) % 4
    r = inspect_batch({"image": x, "label": y})
    assert r.passed  # [0, 1] images are acceptable
    for c in range(3):
        assert r.channel_mean[c] == pytest.approx(float(x[:, c].mean()), rel=1e-6)
        assert r.channel_std[c] == pytest.approx(float(x[:, c].std(correction=0)), rel=1e-6)
        assert r.channel_max[c] == pytest.approx(float(x[:, c].max()))
        assert r.channel_min[c] == pytest.approx(float(x[:, c].min()))
    bad = inspect_batch((_images(gen, scale=255.0), y))
    assert not bad.passed and "channel" in bad.causes[0]


def test_features_on_different_scales_fail():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(128, 3, generator=gen) * torch.tensor([1e-3, 1.0, 2.0])
    r = inspect_batch((x, torch.randint(0, 2, (128,), generator=gen)))
    assert not r.passed and "different scales" in r.causes[0]


def test_nan_inputs_fail():
    x, y = F.digits(32)
    x[3, 5] = float("nan")
    r = inspect_batch((x, y))
    assert not r.passed and "NaN/Inf" in r.causes[0]


def test_sorted_labels_fail():
    x, y = F.digits(512)
    keep = y == 3
    r = inspect_batch((x[keep][:32], y[keep][:32]), num_classes=10)
    assert not r.passed and "every label in the batch is 3" in r.causes[0]
    assert r.summary().endswith("1 of 10 classes present")


def test_labels_out_of_range_fail():
    x, y = F.digits(32)
    r = inspect_batch((x, y + 1), num_classes=10)  # 1-based labels
    assert not r.passed and r.verdict == "LABELS" and "out of range" in r.causes[0]


def test_misaligned_lengths_fail():
    x, y = F.digits(32)
    r = inspect_batch((x, y[:31]))
    assert not r.passed and "31 labels for 32 inputs" in r.causes[0]


def test_conflicting_duplicates_fail():
    x, y = F.digits(32)
    x[16:] = x[:16]
    y[16:] = (y[:16] + 1) % 10
    r = inspect_batch((x, y))
    assert not r.passed and "identical inputs but different labels" in r.causes[0]


def test_imbalance_is_a_warning_not_a_failure():
    x, y = F.digits(100)
    y = torch.where(torch.arange(100) < 80, torch.tensor(7), y)
    r = inspect_batch((x, y), num_classes=10)
    assert r.passed and r.balanced is False
    share = 100 * int((y == 7).sum()) / 100
    assert any(f"class 7 is {share:.0f}% of the batch" in w for w in r.warnings)
    assert "imbalanced" in r.summary()


def test_decoder_shows_samples_beside_labels():
    x, y = F.digits(16)
    r = inspect_batch((x, y), F.decode_digit, max_samples=3)
    assert [s["label"] for s in r.samples] == [str(int(v)) for v in y[:3]]
    assert r.samples[0]["text"] == F.decode_digit(x[0])
    text = r.samples_text()
    assert text.splitlines()[0] == f"label {int(y[0])}:"


def test_decoder_error_is_reported_not_raised():
    x, y = F.digits(8)

    def broken(_sample):
        raise KeyError("vocab")

    r = inspect_batch((x, y), broken)
    assert r.samples == []
    assert any("decode() raised KeyError" in w for w in r.warnings)


def test_regression_targets_and_integer_inputs():
    x, t = F.regression_data()
    r = inspect_batch((x, t))
    assert r.passed and r.task == "regression"
    assert "targets mean" in r.summary()
    ids = torch.randint(0, 1000, (8, 12))
    r2 = inspect_batch((ids, torch.randint(0, 2, (8,))))
    assert r2.normalized is None and "ids" in r2.warnings[0]


def test_unreadable_batch_is_a_clear_error():
    with pytest.raises(CheckError, match="cannot read a batch"):
        inspect_batch(42)
    with pytest.raises(CheckError, match="dict with keys"):
        inspect_batch({"pixels": torch.zeros(2, 3)})
