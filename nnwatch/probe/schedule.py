"""Which steps are measured in full and which take per-layer statistics, and what that costs.

A *measured* step records the layer output sums and every gradient norm; a *sampled* step also
takes the per-layer activation statistics. The cost budget (:mod:`nnwatch.probe.budget`) thins
both out when they would cost more than their share of the step time, and this schedule lifts
the thinning where a step matters: the first ``WARMUP_STEPS``, a step with a pending snapshot or
anomaly detection, the ``AFTER_TROUBLE`` steps after non-finite gradients, and every step while
the loss spikes or climbs (:mod:`nnwatch.probe.loss_trend`). While the loss goes wrong (and
``STATS_HOLD`` steps after) the per-layer statistics are taken on every step too: units that die
after a bad update do so within a few steps, which an interval of 10-100 steps would miss.

The hooks read ``measure``, ``sampled`` and add to ``own`` directly (plain attributes: they run
once per layer per step).
"""

from __future__ import annotations

import time

from nnwatch.probe.budget import CostBudget
from nnwatch.probe.loss_trend import HOLD, SHORT_HOLD, LossTrend

WARMUP_STEPS = 10  # steps measured in full at the start, whatever the budget says
DEFAULT_LAYER_INTERVAL = 10  # full per-layer stats every 10 steps, stretched if over budget
AFTER_TROUBLE = 100  # steps measured in full after non-finite gradients were seen
STATS_HOLD = 10  # steps still sampled in full after the loss looks normal again
SHORT_STATS_HOLD = 2  # after a lone doubled loss (see ``LossTrend.severe``)


class Schedule:
    """Owns the measure/sample decision of each step and the own-time bookkeeping of the budget."""

    def __init__(
        self, start_step: int, budget: float | None, max_interval: int, layer_interval: int | None
    ) -> None:
        # cost budget: measure layer sums and gradient norms on every k-th step (see budget.py)
        self.budget = CostBudget(
            budget, max_interval, DEFAULT_LAYER_INTERVAL if layer_interval is None else layer_interval,
            stretch_stats=layer_interval is None,
        )
        self.measure = True  # this step's layer sums and gradient norms are measured
        self.sampled = True  # step 0 always samples per-layer stats
        self.since_measured = 0  # unmeasured steps since the last measured one
        self.measure_until = start_step + WARMUP_STEPS  # every step before this one is measured
        self.sample_until = 0  # every step before this one takes per-layer statistics
        self.loss_trend = LossTrend()  # measures every step while the loss goes wrong
        self.own = 0.0  # seconds spent in nnwatch's own code during this step

    @property
    def layer_interval(self) -> int:
        return self.budget.layer_interval

    def advance(self, step_index: int, snapshot_pending: bool) -> bool:
        """Decide the next step (``step_index``); returns whether it needs the layer hooks."""
        budget = self.budget
        self.sampled = sampled = (
            step_index % budget.layer_interval == 0 or step_index < self.sample_until
        )
        self.since_measured = 0 if self.measure else self.since_measured + 1
        self.measure = measure = (
            (sampled and budget.measures_sampled_steps())
            or step_index < self.measure_until
            or self.since_measured + 1 >= budget.interval
            or snapshot_pending
        )
        return measure or sampled

    def charge(self, t0: float, step_time: float, measured: bool, sampled: bool, first: bool) -> None:
        """The step's own seconds (hooks, and ``w.step()`` since ``t0``) go to the budget.

        The first step also sets up the run files: not a step's cost.
        """
        if not first:
            self.budget.add(self.own + (time.perf_counter() - t0), step_time, measured, sampled)
        self.own = 0.0

    def on_loss(self, step: int, loss: float) -> None:
        """The loss as published: while it spikes or climbs, every step is measured, so an
        explosion is never between two samples."""
        trend = self.loss_trend
        if trend.add(step, loss):
            severe = trend.severe
            hold, stats = (HOLD, STATS_HOLD) if severe else (SHORT_HOLD, SHORT_STATS_HOLD)
            self.measure_until = max(self.measure_until, step + 2 + hold)
            self.sample_until = max(self.sample_until, step + 2 + stats)

    def after_trouble(self, step_index: int) -> None:
        """Non-finite gradients at ``step_index``: watch what follows closely."""
        self.measure_until = step_index + 1 + AFTER_TROUBLE

