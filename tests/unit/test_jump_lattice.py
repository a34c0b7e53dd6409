"""Jumps of the loss at a fixed period are data read in blocks; jumps at random, or made by the
LR schedule or by an epoch's short last batch, are not."""

from __future__ import annotations

import math

import numpy as np

from nnwatch.diagnosis.detectors.jump_lattice import JumpLattice
from nnwatch.diagnosis.row import Row


def _feed(losses: np.ndarray, lrs: np.ndarray | None = None, sizes: np.ndarray | None = None):
    lattice, found = JumpLattice(), None
    for i, loss in enumerate(losses):
        row = Row.__new__(Row)  # only the fields the lattice reads
        row.step, row.loss = i, float(loss)
        row.lr = np.array([lrs[i] if lrs is not None else 1e-3])
        row.batch_size = float(sizes[i]) if sizes is not None else 64.0
        found = lattice.push(row) or found
    return found


def _sawtooth(steps: int, period: int, rng: np.random.Generator) -> np.ndarray:
    """A loss that falls, and jumps 6x at every block boundary before adapting again."""
    t = np.arange(steps)
    base = 0.3 * np.exp(-t / 300) + 0.05
    bump = np.where((t % period < 4) & (t >= period), 5.0 * np.exp(-(t % period)), 0.0)
    return base * (1 + bump) * np.exp(0.05 * rng.standard_normal(steps))


def test_jumps_at_every_block_boundary_give_the_period():
    found = _feed(_sawtooth(300, 30, np.random.default_rng(0)))
    assert found is not None
    period, jumps = found
    assert period == 30 and [s for s, _ in jumps] == [30, 60, 90, 120]


def test_one_step_spikes_at_a_fixed_period_are_bad_batches_not_blocks():
    losses = 0.1 * np.exp(0.05 * np.random.default_rng(1).standard_normal(400))
    losses[30::30] *= 6.0  # the same bad batch at the same place in every epoch
    assert _feed(losses) is None


def test_a_run_with_random_sustained_jumps_rarely_shows_a_period():
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(200):
        losses = 0.1 * np.exp(0.05 * rng.standard_normal(600))
        for at in rng.choice(np.arange(20, 590), size=8, replace=False):
            losses[at : at + 3] *= 6.0
        found += _feed(losses) is not None
    assert found <= 10  # at most 5% of runs with eight big sustained jumps at random


def test_jumps_made_by_warm_restarts_are_not_counted():
    steps, period = 300, 30
    lrs = np.array([1e-3 * (0.5 * (1 + math.cos(math.pi * (i % period) / period))) + 1e-5 for i in range(steps)])
    assert _feed(_sawtooth(steps, period, np.random.default_rng(2)), lrs=lrs) is None


def test_jumps_on_an_epochs_short_last_batch_are_not_counted():
    steps, period = 300, 30
    sizes = np.where((np.arange(steps) % period == 0) & (np.arange(steps) > 0), 8.0, 64.0)
    assert _feed(_sawtooth(steps, period, np.random.default_rng(3)), sizes=sizes) is None
