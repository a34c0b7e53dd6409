"""Full-batch softmax regression with an LR 100x too high: the loss jumps 15x and never comes back."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import digits_std, seed_all

CASE = dict(
    name="bug_softmax_regression_lr_100x",
    expected=["loss_diverging"],
    acceptable=["oscillating_loss", "exploding_gradients", "loss_stalled"],
    onset_step=1,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 1, 1: 1, 2: 1},
    control=False,
    description="Multinomial logistic regression (one nn.Linear(64, 10)) on all 1797 standardized digits with "
                "15% noisy labels, full-batch SGD(lr=100) where lr=1.0 was meant (a '1e2' vs '1e0' typo). The "
                "cross-entropy grows only linearly in the logits, so nothing overflows: the loss jumps from "
                "ln 10 to ~40 at step 1 and then bounces chaotically at ~10-30x its start for the whole run "
                "(no NaN, no convergence, never back near its start). With separable (clean) labels the same "
                "LR would eventually converge; the label noise is what keeps it from settling. No fixed "
                "control (control=False): with 30% wrong labels the lr=1.0 run cannot halve its loss, so it "
                "would not pass the 'healthy' rule although nothing is wrong with it. Wu et al. 2024 ('Large stepsize GD "
                "for logistic loss') describe this non-monotone regime; here it never settles.",
)


def build(seed, bug=True):  # bug=False (lr=1.0) is not a scored control, see control=False
    g = seed_all(seed)
    X, y = digits_std()
    flip = torch.rand(len(y), generator=g) < 0.30
    y = torch.where(flip, torch.randint(0, 10, (len(y),), generator=g), y)
    model = nn.Linear(64, 10)
    steps = 200
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=100.0 if bug else 1.0),
                loss_fn=F.cross_entropy, batches=lambda s: (X, y), steps=steps, num_classes=10, scaler=None,
                autocast=None, clip=None)
