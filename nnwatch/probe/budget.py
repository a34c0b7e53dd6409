"""How often the probe can afford to measure, decided from what its own work costs.

A full measurement (every layer's output sum in the forward pass, every gradient's norm before
``optimizer.step()``) reads all activations and all gradients once more. That is nearly free on a
GPU, where it overlaps the step, but on a CPU it is memory-bound: several percent of an MLP step
on this project's 2-core machine. Rather than making users choose, the probe times its own work
and measures every k-th step, with k the smallest interval (at most ``max_interval``) that keeps
its average cost under ``fraction`` of the step time. Steps in between still record the loss, the
LR, timings and memory, and the non-finite guard still checks a small gradient on them.

Full per-layer statistics cost more again. With the default ``layer_interval`` they are taken
every 10 steps, stretched to 20, 50 or 100 when even that does not fit the budget; an interval
the user set explicitly is kept as it is.

The training thread only adds its timings to running sums (on a CPU whose caches the step has
just flushed, every Python line costs about a microsecond); :meth:`CostBudget.update` turns them
into intervals every ``UPDATE_EVERY`` steps, with exponential averages so that one slow step on
a shared machine does not swing the choice.
"""

from __future__ import annotations

import math

#: Steps between two decisions.
UPDATE_EVERY = 16
#: Weight of a new batch of timings in the running averages.
ALPHA = 0.3
#: Per-layer statistics intervals tried, as multiples of the starting one (10 -> 20, 50, 100).
STATS_STRETCH = (1, 2, 5, 10)


class CostBudget:
    """Picks the measurement intervals from the measured cost of nnwatch's own work per step."""

    def __init__(
        self, fraction: float | None = 0.01, max_interval: int = 16, layer_interval: int = 10,
        stretch_stats: bool = True,
    ) -> None:
        if fraction is not None and not fraction > 0:
            raise ValueError(
                f"budget must be a positive fraction of the step time or None, got {fraction!r}"
            )
        self.fraction = fraction
        self.max_interval = max(1, int(max_interval))
        self.base_layer_interval = max(1, int(layer_interval))
        self.stretch_stats = stretch_stats
        self.interval = 1  # measure layer sums and gradient norms every `interval` steps
        self.layer_interval = self.base_layer_interval  # full per-layer stats every ... steps
        # running averages, seconds per step of each kind
        self.light_cost = math.nan  # own work on a step that records scalars only
        self.full_cost = math.nan  # ... on a measured step
        self.sampled_cost = math.nan  # ... on a step with full per-layer statistics
        self.step_time = math.nan  # wall time between two w.step() calls
        # since the last update: [seconds, steps] per kind (light, measured, sampled), wall time
        self.acc = [0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0]

    def add(self, own: float, step_time: float, measured: bool, sampled: bool) -> None:
        """One step's own seconds and wall time; decides every ``UPDATE_EVERY`` steps."""
        acc = self.acc
        kind = (4 if sampled else 2) if measured else 0
        acc[kind] += own
        acc[kind + 1] += 1
        acc[6] += step_time
        acc[7] += 1
        if acc[7] >= UPDATE_EVERY:
            self.update()

    def set_layer_interval(self, n: int) -> None:
        """The user (or a monitor) chose the statistics interval: keep it from now on."""
        self.base_layer_interval = self.layer_interval = max(1, int(n))
        self.stretch_stats = False

    def update(self) -> None:
        """Fold the accumulated timings into the averages and choose the intervals."""
        a = self.acc
        self.acc = [0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0]
        if self.fraction is None:
            return
        self.light_cost = _fold(self.light_cost, a[0], a[1])
        self.full_cost = _fold(self.full_cost, a[2], a[3])
        self.sampled_cost = _fold(self.sampled_cost, a[4], a[5])
        self.step_time = _fold(self.step_time, a[6], a[7])
        self.interval, self.layer_interval = self._pick()

    def average_cost(self, k: int, layer_interval: int) -> float:
        """Own seconds per step with layer sums every k steps and stats every ``layer_interval``."""
        full = self.full_cost if math.isfinite(self.full_cost) else self.sampled_cost
        light = self.light_cost if math.isfinite(self.light_cost) else full
        sampled = self.sampled_cost if math.isfinite(self.sampled_cost) else full
        return light + max(full - light, 0.0) / k + max(sampled - full, 0.0) / layer_interval

    def _pick(self) -> tuple[int, int]:
        assert self.fraction is not None
        if not (math.isfinite(self.step_time) and (math.isfinite(self.full_cost) or math.isfinite(self.sampled_cost))):
            return self.interval, self.layer_interval
        own_now = self.average_cost(self.interval, self.layer_interval)
        allowed = self.fraction * max(self.step_time - own_now, 1e-9)  # of the bare step
        stretches = STATS_STRETCH if self.stretch_stats else (1,)
        # gradient norms every few steps matter more than full statistics every few: the
        # statistics interval stretches first
        for k in range(1, self.max_interval + 1):
            for s in stretches:
                li = self.base_layer_interval * s
                if self.average_cost(k, li) <= allowed:
                    return k, li
        return self.max_interval, self.base_layer_interval * stretches[-1]


def _fold(avg: float, total: float, n: int) -> float:
    if n == 0:
        return avg
    value = total / n
    return value if not math.isfinite(avg) else avg + ALPHA * (value - avg)
