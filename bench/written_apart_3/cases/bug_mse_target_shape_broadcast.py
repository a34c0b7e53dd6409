"""Regression head [B, 1] against targets [B]: MSELoss broadcasts to [B, B]."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_mse_target_shape_broadcast",
    expected=["loss_stalled"],
    acceptable=[],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "Standardised regression target (a smooth function of the digits pixels), model output "
        "of shape [B, 1], target of shape [B]: `nn.MSELoss()(out, y)` broadcasts to [B, B] and "
        "averages (out_i - y_j)^2 over all pairs, whose minimum is reached by predicting the "
        "batch mean for every input. The loss sits at var(y) ~ 1 from the start; the control "
        "(y[:, None]) reaches ~0.015. PyTorch only prints a UserWarning once. Modelled on "
        "timeseriesAI/tsai#22 'Torch size issue and regression inference' ('Using a target size "
        "(torch.Size([16])) that is different to the input size (torch.Size([16, 1])) ... I "
        "suspect as a result of that my model is not training across epochs') and "
        "deepset-ai/FARM#229 'Using a target size ... that is different to the input size'."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, _ = load_digits_std()
    gt = torch.Generator().manual_seed(77)
    W1 = torch.randn(64, 16, generator=gt) / 8
    t = torch.tanh(X @ W1).sum(1) + 0.1 * torch.randn(X.shape[0], generator=gt)
    t = (t - t.mean()) / t.std()
    model = mlp([64, 128, 128, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mse = nn.MSELoss()
    if bug:
        def loss_fn(out, y):
            return mse(out, y)
    else:
        def loss_fn(out, y):
            return F.mse_loss(out, y[:, None])
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=loss_fn,
                batches=dataset_batches(X, t, 64, steps, g), steps=steps, num_classes=None,
                scaler=None, autocast=None, clip=None)
