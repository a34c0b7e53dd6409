"""A 20-hidden-layer plain ReLU MLP left at PyTorch's default nn.Linear init."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_deep_relu_mlp_default_init",
    expected=["vanishing_gradients"],
    acceptable=["loss_stalled"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A plain (no normalisation, no residual) 20-hidden-layer ReLU MLP of width 128 keeps "
        "nn.Linear's default init, kaiming_uniform_(a=sqrt(5)), i.e. U(+-1/sqrt(fan_in)): a "
        "gain of 1/sqrt(3) where ReLU needs sqrt(2). The signal shrinks ~2.4x per layer, so the "
        "first layer's gradient is ~3-4e-7 of the last layer's and the loss stays at ln 10 (SGD "
        "lr 0.005, momentum 0.9); ~75% of the updates of elements with a non-zero gradient are "
        "even below float32 resolution. Modelled on pytorch/pytorch#15314 'Kaiming init of conv "
        "and linear layers, why gain = sqrt(5)' (the default is not He init for ReLU nets; see "
        "also pytorch/pytorch#129302). Fix: kaiming_normal_(nonlinearity='relu'), zero biases."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64] + [128] * 20 + [10])
    if not bug:
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
