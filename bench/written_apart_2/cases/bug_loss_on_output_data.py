"""Bug: the task loss is computed on `logits.data` (no autograd history). The backward error was
'fixed' by adding an L2 penalty, so backward runs, but only weight decay reaches the parameters."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_loss_on_output_data", expected=["loss_stalled"], acceptable=["vanishing_gradients"], onset_step=0,
    description="64-96-96-10 ReLU MLP on digits; loss = CE(logits.data, y) + 1e-4*sum(W^2). Adam 1e-3, batch 64, "
                "250 steps. The CE term has no gradient; the only gradient is the tiny L2 term, so the loss sits at "
                "its initial value. Fixed: CE(logits, y) + the same L2.",
)


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(), nn.Linear(96, 10))
    ws = [m.weight for m in model if isinstance(m, nn.Linear)]

    def loss_fn(out, t):
        l2 = 1e-4 * sum((w ** 2).sum() for w in ws)
        return F.cross_entropy(out.data if bug else out, t) + l2
    steps = 250
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=loss_fn,
                batches=fixed_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=None,
                autocast=None, clip=None)
