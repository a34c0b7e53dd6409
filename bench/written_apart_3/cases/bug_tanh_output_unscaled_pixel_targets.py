"""Tanh-output autoencoder trained against raw 0-255 pixel targets (white-background scans)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_raw, seed_all

CASE = dict(
    name="bug_tanh_output_unscaled_pixel_targets",
    expected=["saturated_activation"],
    acceptable=["loss_stalled", "vanishing_gradients"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A small autoencoder for scanned 8x8 glyphs (white paper: background 255, ink 0) ends "
        "in nn.Tanh, as in DCGAN-style code, but the reconstruction target is the raw 0..255 "
        "image (the /127.5 - 1 scaling was dropped). Most targets are unreachable for tanh, so "
        "the output pre-activations are driven far positive: the output Tanh's mean derivative "
        "(1 - t^2) falls to ~0.002 and the hidden Tanh layers saturate too; the MSE stays at "
        "~4e4. Modelled on fstrub95/Autoencoders_cf#4 'about the input range' ('breaking the "
        "target range ... the target becomes unreachable for Tanh() transfer function ... to "
        "avoid this saturation') and AntixK/PyTorch-VAE#108 'Normalization issues for dataset' "
        "(Tanh output against targets in another range). Fix: targets scaled to [-1, 1]."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    Xraw, _ = load_digits_raw()
    inp = Xraw / 16.0
    target = 255.0 * (1.0 - Xraw / 16.0)
    if not bug:
        target = target / 127.5 - 1.0
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 64), nn.Tanh())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.mse_loss,
                batches=dataset_batches(inp, target, 64, steps, g), steps=steps,
                num_classes=None, scaler=None, autocast=None, clip=None)
