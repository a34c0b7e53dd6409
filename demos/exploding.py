"""exploding: a deep MLP warms up to a learning rate that is too high, with no gradient clipping.

What you see: the loss falls for a few dozen steps, then the gradient norm shoots up and the loss
goes to Inf/NaN; nnwatch reports ``exploding_gradients`` (and the NaN). Like a long run resuming
from its last checkpoint, the script then restarts from its initial weights, and it explodes again.

Fix it live: press ``c`` in the monitor, type 1.0 and confirm. The script's
``w.clip_grad_norm_(max_norm=None)`` only measures until a threshold is set from the monitor; from
the next step it clips at 1.0, the clipped gradient norm stays at the threshold line and the loss
comes down instead of exploding. In your own script the fix is one line before optimizer.step():
``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)`` (and a lower LR).

Run it: ``nnwatch demo exploding`` (live monitor), or ``python demos/exploding.py --steps 300``.
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
from torch import nn

import nnwatch

PEAK_LR = 0.6  # too high for this network without clipping
WARMUP_STEPS = 100


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A smooth regression target: y = a small random tanh network of x."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 16, generator=g)
    w1, w2 = torch.randn(16, 32, generator=g) / 4, torch.randn(32, 1, generator=g)
    y = torch.tanh(x @ w1) @ w2
    return x, (y - y.mean()) / y.std()


def make_model() -> nn.Module:
    layers: list[nn.Module] = []
    width_in = 16
    for _ in range(8):
        layers += [nn.Linear(width_in, 64), nn.Tanh()]
        width_in = 64
    return nn.Sequential(*layers, nn.Linear(64, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=100_000, help="training steps (default: until stopped)"
    )
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait after each step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = make_data(args.seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=PEAK_LR)
    checkpoint = copy.deepcopy(model.state_dict())
    restart = 0  # the step the current attempt started at (the warmup restarts with it)
    far_off = 0  # steps in a row with the loss a billion times where it started

    # A toy model's step takes about a millisecond: measure every step. (By default nnwatch keeps
    # its own cost under 1% of the step time, by measuring gradients and layers less often.)
    with nnwatch.watch(model, optimizer, name="exploding", budget=None) as w:
        for step in range(args.steps):
            if w.should_stop:  # a monitor sent `stop` (nnwatch ctl RUN stop)
                break
            lr = PEAK_LR * min(1.0, (step - restart + 1) / WARMUP_STEPS)
            for group in optimizer.param_groups:
                group["lr"] = lr
            idx = torch.randint(0, len(x), (64,))
            batch = (x[idx], y[idx])
            loss = nn.functional.mse_loss(model(batch[0]), batch[1])
            optimizer.zero_grad()
            loss.backward()
            w.clip_grad_norm_(max_norm=None)  # measures; clips once the monitor sets a threshold
            optimizer.step()
            w.step(loss, batch=batch)
            value = loss.item()
            far_off = far_off + 1 if value > 1e9 else 0
            if not math.isfinite(value) or far_off > 20:  # diverged: restart from the checkpoint
                print(f"step {step}: the loss is {value:.3g}; restarting from the checkpoint")
                model.load_state_dict(checkpoint)
                restart, far_off = step + 1, 0
            time.sleep(args.delay)


if __name__ == "__main__":
    main()
