"""How often the probe can afford to measure, decided from what its own work costs.

A full measurement (every layer's output sum in the forward pass, every gradient's norm before
``optimizer.step()``) reads all activations and all gradients once more. That is nearly free on a
GPU, where it overlaps the step, but on a CPU it is memory-bound: several percent of an MLP step
on this project's 2-core machine. Rather than making users choose, the probe times its own work
and measures every k-th step, with k the smallest interval (at most ``max_interval``) that keeps
its average cost under ``fraction`` of the step time. Steps in between still record the loss, the
LR, timings and memory, and the non-finite guard still checks a small gradient on them.

Full per-layer statistics cost more again. With the default ``layer_interval`` they are taken
every 10 steps, stretched to 20, 50 or 100 when even that does not fit the budget. An interval
the user set explicitly is kept as it is and paid for as asked: the budget then governs only
what it can leave out, the measurements (with statistics every step, the "detailed" mode, layer
sums and gradient norms still follow the budget).

The fraction covers the writer thread as well: the run log's writer (and the detectors, until
they move to their own process) holds the same GIL on the same cores, so its CPU per record
(``background``, over the recent drains) is counted in every step's base cost. Measuring less
cannot lower it: a writer that alone takes the whole fraction leaves the probe at its longest
intervals, the most the budget can do.

The budget aims at ``AIM`` (70%) of the fraction, not all of it: it steers by running averages of a
noisy machine, and the cost it is held to is the measured median, not the average it predicted.

The training thread only adds its timings to running sums and a short list (on a CPU whose caches
the step has just flushed, every Python line costs about a microsecond); :meth:`CostBudget.update`
turns them into intervals every ``UPDATE_EVERY`` steps, with exponential averages so that one slow
step on a shared machine does not swing the choice. The step time it budgets against is the median
of those steps, not their mean: the wall time between two ``w.step()`` calls also holds whatever
the loop did in between (a validation pass, a checkpoint, a pause from the monitor), and one such
gap of a minute would otherwise let measurement cost 1% of a minute per step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

#: Steps between two decisions.
UPDATE_EVERY = 16
#: Weight of a new batch of timings in the running averages.
ALPHA = 0.3
#: Per-layer statistics intervals tried, as multiples of the starting one (10 -> 20, 50, 100).
STATS_STRETCH = (1, 2, 5, 10)
#: Share of the budget the choice aims at, leaving room for the averages' error.
AIM = 0.7


class CostBudget:
    """Picks the measurement intervals from the measured cost of nnwatch's own work per step.

    Steps come in four kinds: light, with per-layer statistics only, measured (layer sums and
    gradient norms), and both. Their average costs give a base cost, what a measurement adds and
    what statistics add, which is what the intervals are chosen from.
    """

    def __init__(
        self, fraction: float | None = 0.01, max_interval: int = 32, layer_interval: int = 10,
        stretch_stats: bool = True,
    ) -> None:
        #: nnwatch's own seconds on the training thread and the steps' wall seconds, whole run
        self.own_total = 0.0
        self.wall_total = 0.0
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
        #: running averages, seconds of own work per step of each kind, indexed
        #: ``2 * measured + sampled``: light, statistics only, measured, measured with statistics
        self.cost = [math.nan] * 4
        self.step_time = math.nan  # wall time between two w.step() calls (folded medians)
        # since the last update: [seconds, steps] per kind, and each step's wall time
        self.acc = [0.0, 0] * 4
        self.times: list[float] = []
        #: seconds of CPU per step spent for nnwatch in this process off the training thread
        #: (the run log's writer: it holds the same GIL, on the same cores), read at each
        #: decision; the budget holds that and its own work together to the fraction
        self.background: Callable[[], float] | None = None

    def add(self, own: float, step_time: float, measured: bool, sampled: bool) -> None:
        """One step's own seconds and wall time; decides every ``UPDATE_EVERY`` steps."""
        acc = self.acc
        kind = 4 * measured + 2 * sampled
        acc[kind] += own
        acc[kind + 1] += 1
        self.own_total += own
        if step_time == step_time and step_time > 0:  # not NaN
            self.wall_total += step_time
        times = self.times
        times.append(step_time)
        if len(times) >= UPDATE_EVERY:
            self.update()

    @property
    def own_share(self) -> float:
        """nnwatch's own time on the training thread as a share of the run's step time so far."""
        return self.own_total / self.wall_total if self.wall_total > 0 else float("nan")

    def set_layer_interval(self, n: int) -> None:
        """The user (or a monitor) chose the statistics interval: keep it from now on."""
        self.base_layer_interval = self.layer_interval = max(1, int(n))
        self.stretch_stats = False

    def measures_sampled_steps(self) -> bool:
        """Whether a statistics step is measured in full too: when statistics are the rarer."""
        return self.layer_interval >= self.interval

    def update(self) -> None:
        """Fold the accumulated timings into the averages and choose the intervals."""
        a, times = self.acc, self.times
        self.acc = [0.0, 0] * 4
        self.times = []
        if self.fraction is None:
            return
        for kind in range(4):
            self.cost[kind] = _fold(self.cost[kind], a[2 * kind], a[2 * kind + 1])
        if times:
            self.step_time = _fold(self.step_time, statistics.median(times), 1)
        self.interval, self.layer_interval = self._pick()

    def parts(self) -> tuple[float, float, float]:
        """(base, measurement, statistics): own seconds of a light step, and what each adds.

        Every kind of step seen so far informs them; a part never seen separately is charged in
        full to the measurement (the costlier guess), so that the first choice errs towards
        measuring less, and the light steps it then sees correct it.
        """
        light, stats, meas, both = self.cost
        ok = math.isfinite
        # what statistics add: a measured step with and without them, else a light one
        if ok(both) and ok(meas):
            d_stats = both - meas
        elif ok(stats) and ok(light):
            d_stats = stats - light
        else:
            d_stats = 0.0
        # what a measurement adds, likewise (knowing it means a light or statistics step was seen)
        if ok(meas) and ok(light):
            d_meas, base = meas - light, light
        elif ok(both) and ok(stats):
            d_meas, base = both - stats, stats - d_stats
        else:  # only measured steps so far (or only light ones: then nothing to decide from)
            d_meas = meas if ok(meas) else both - d_stats
            base = light if ok(light) else stats - d_stats if ok(stats) else 0.0
        return max(base, 0.0), max(d_meas, 0.0), max(d_stats, 0.0)

    def average_cost(self, k: int, layer_interval: int) -> float:
        """Own seconds per step with layer sums every k steps and stats every ``layer_interval``."""
        base, d_meas, d_stats = self.parts()
        return base + d_meas / k + d_stats / layer_interval

    def _background(self) -> float:
        try:
            value = float(self.background()) if self.background is not None else 0.0
        except Exception:  # noqa: BLE001 - a gauge; the budget then counts its own work only
            return 0.0
        return value if math.isfinite(value) and value > 0 else 0.0

    def _pick(self) -> tuple[int, int]:
        assert self.fraction is not None
        base, d_meas, d_stats = self.parts()
        if not (math.isfinite(self.step_time) and math.isfinite(d_meas)) or (
            d_meas <= 0.0 and math.isnan(self.cost[0])
        ):
            # no light step seen and measured steps timed no dearer than the others: that is
            # the noise of a shared machine, not a free measurement; keep the current choice
            return self.interval, self.layer_interval
        own_now = self.average_cost(self.interval, self.layer_interval)
        allowed = AIM * self.fraction * max(self.step_time - own_now, 1e-9)  # of the bare step
        if not self.stretch_stats and math.isnan(self.cost[0]):
            # statistics on every step as the user asked: no light step is ever seen, and the
            # base is what the budget cannot tell apart
            base = 0.0
        base += self._background()
        if not self.stretch_stats:
            # statistics at the rate the user asked for are paid as asked
            li = self.base_layer_interval
            for k in range(1, self.max_interval + 1):
                if base + d_meas / k <= allowed:
                    return k, li
            return self.max_interval, li
        # gradient norms every few steps matter more than full statistics every few: the
        # statistics interval stretches first
        for k in range(1, self.max_interval + 1):
            for s in STATS_STRETCH:
                li = self.base_layer_interval * s
                if base + d_meas / k + d_stats / li <= allowed:
                    return k, li
        return self.max_interval, self.base_layer_interval * STATS_STRETCH[-1]


def _fold(avg: float, total: float, n: float) -> float:
    if n == 0:
        return avg
    value = total / n
    return value if not math.isfinite(avg) else avg + ALPHA * (value - avg)
