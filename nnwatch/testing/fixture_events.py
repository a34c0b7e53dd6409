"""The events of the fixture run: what the detectors, the snapshot writer and the command thread
of a real run would have logged at the fixture's loss spike, AMP overflows and dying layer.

Apart from :class:`~nnwatch.testing.fixture.FixtureSource`, which makes the numbers: these are
the few lines a run's events file would hold, written as an older nnwatch wrote them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nnwatch.store.schema import FieldName

#: The ReLU layer of the fixture model that dies over the run.
DYING_LAYER = "blocks.2.act"


def fixture_events(
    halving_steps: Sequence[int],
    spike_step: int,
    dead_step: int,
    steps: int | None,
    scale_before: Callable[[int], float],
) -> list[dict[str, Any]]:
    """What the detectors, the snapshot writer and the command thread would have logged, in step
    order, up to ``steps``: an overflow at each of the ``halving_steps`` (the loss scale before
    it from ``scale_before``), the loss spike with its snapshot and the clip command after it,
    and the dying layer."""
    ev: list[dict[str, Any]] = []
    for h in halving_steps:
        ev.append(
            {
                "kind": "amp_overflow",
                "severity": "info",
                "step": h,
                "layer": None,
                "evidence": {"scale_before": scale_before(h)},
                "remedy": "none needed if rare; frequent overflows mean the LR is too high",
                "message": "AMP overflow: step skipped, loss scale halved",
            }
        )
    ev.extend(_spike_events(spike_step))
    ev.append(
        {
            "kind": "dead_units",
            "severity": "error",
            "step": dead_step,
            "layer": DYING_LAYER,
            "evidence": {"zero_fraction": 0.81},
            "remedy": "lower the LR, or use LeakyReLU/GELU, or check the init",
            "message": f"{DYING_LAYER}: 81% of units output exactly zero",
        }
    )
    ev.sort(key=lambda e: e["step"])
    if steps is not None:
        ev = [e for e in ev if e["step"] < steps]
    return ev


def _spike_events(sp: int) -> list[dict[str, Any]]:
    """The loss spike at step ``sp``: the finding, the snapshot it took, and the clip command
    sent 40 steps later."""
    return [
        {
            "kind": "loss_spike",
            "severity": "warning",
            "step": sp,
            "layer": "head",
            "evidence": {"loss": 6.5, FieldName.GRAD_NORM: 38.0},
            "remedy": "lower the LR or tighten grad clipping",
            "message": "loss jumped 6.5x above its EMA; grad norm 38 (69x median)",
        },
        {
            "type": "snapshot",
            "step": sp,
            "reason": "auto: loss_spike",
            "path": f"snapshots/step-{sp:08d}",
        },
        {
            "type": "command",
            "step": sp + 40,
            "name": "clip",
            "args": {"max_norm": 1.0},
            "message": "clip 1.0 applied",
        },
    ]
