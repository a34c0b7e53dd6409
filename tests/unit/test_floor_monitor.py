"""The overhead benchmark's floor row does the work it stands for: a hand-written monitor whose
record holds each step's loss and the global gradient norm torch would compute, at the end of
every backward, before the update."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from floor_monitor import FloorMonitor  # noqa: E402 - a benchmark module, not part of the package

RECORD = struct.Struct("<5d")


def test_the_floor_monitor_records_the_loss_and_torchs_norm_every_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    floor = FloorMonitor(model, opt)
    expected = []
    try:
        for step in range(5):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1))
            loss.backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            expected.append((step, loss.item(), norm.item()))
            opt.step()
            floor.step(loss)
        ring = floor._ring  # noqa: SLF001 - the record is what the test reads
        for step, loss_value, norm in expected:
            got = RECORD.unpack_from(ring, step * RECORD.size)
            assert got[0] == step
            assert got[2] == pytest.approx(loss_value, rel=1e-6)
            assert got[3] == pytest.approx(norm, rel=1e-5)
            assert got[4] == 0.1
    finally:
        floor.close()
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks
