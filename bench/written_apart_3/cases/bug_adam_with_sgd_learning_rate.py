"""Optimizer switched from SGD to Adam, the SGD learning rate (0.3) kept."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_adam_with_sgd_learning_rate",
    expected=["loss_stalled"],
    acceptable=["loss_spike", "oscillating_loss", "exploding_gradients", "saturated_activation"],
    update_evidence=["update_ratio_huge"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A GELU MLP on digits whose config switched `--optimizer sgd` to `adam` but kept `--lr "
        "0.3` (an SGD-momentum value): Adam moves every weight by ~0.3 per step, the first "
        "updates throw the logits to ~200 (loss 200-300 for a few steps; the weight norm grows "
        "28x), and the model then sits at a loss of ~2.0-2.3 (ln 10 = 2.30) for the rest of the "
        "run, without diverging and without NaN; the first updates are 0.1-5x the weight norm. "
        "Modelled on the Data Science Stack Exchange question 51280 'Default value of learning "
        "rate in adam optimizer - Keras' (Adam at its default lr: 'accuracy of training and "
        "validation got stuck at around 50%', training works at 1e-4) - here the LR is far "
        "larger still. Fix: Adam lr 1e-3."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64, 128, 128, 10], act=nn.GELU)
    opt = torch.optim.Adam(model.parameters(), lr=0.3 if bug else 1e-3)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
