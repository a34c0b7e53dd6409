"""Two-tower model whose fusion concatenates the first tower twice."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all


class TwoTower(nn.Module):
    def __init__(self, typo):
        super().__init__()
        self.typo = typo
        self.left = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.right = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        a = self.left(x[:, :32])
        b = self.right(x[:, 32:])
        fused = torch.cat([a, a], 1) if self.typo else torch.cat([a, b], 1)
        return self.head(fused)


CASE = dict(
    name="bug_fusion_typo_drops_second_tower",
    expected=["zero_gradient_layer"],
    acceptable=[],
    update_evidence=["optimizer_param_without_grad"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "Two-tower classifier (top half and bottom half of each 8x8 digit as two 'modalities'); "
        "the fusion line reads `torch.cat([a, a], 1)` instead of `torch.cat([a, b], 1)`. The "
        "second tower is computed but never reaches the loss: its four parameters have "
        ".grad None on every step (the optimizer holds them, Adam skips them), while the rest "
        "trains on half the image. Modelled on layumi/Person_reID_baseline_pytorch#90 "
        "'model.model.fc.parameters()' (a layer held by the optimizer but not used in forward, so "
        "it never gets a gradient) and facebookresearch/detectron2#1386 ('your module has "
        "parameters that were not used in producing loss', the DDP error such a typo raises on "
        "several GPUs). Fix: cat([a, b])."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = TwoTower(typo=bug)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
