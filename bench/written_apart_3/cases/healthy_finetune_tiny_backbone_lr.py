"""Fine-tuning with a tiny backbone LR (1e-5) and a normal head LR: tiny but healthy updates."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all

CASE = dict(
    name="healthy_finetune_tiny_backbone_lr",
    expected=["healthy"],
    acceptable=[],
    description=(
        "Fine-tuning a pretrained backbone (trained in build on digits 0-4) for all ten digits "
        "with discriminative learning rates, the common BERT/ViT fine-tuning pattern: AdamW lr "
        "1e-5 on the backbone (median update/weight ratio ~6e-5 per step for its first layer, "
        "~20-40x below the head's and a from-scratch run's) and 2e-3 on a new head. The "
        "backbone barely moves - by design - while the loss falls from ~2.4 to ~0.2 through the "
        "head."
    ),
)


class Net(nn.Module):
    def __init__(self, n_out):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256),
                                      nn.ReLU())
        self.head = nn.Linear(256, n_out)

    def forward(self, x):
        return self.head(self.backbone(x))


def _pretrained(seed):
    torch.manual_seed(9500 + seed)
    g = torch.Generator().manual_seed(9600 + seed)
    X, y = load_digits_std()
    keep = y < 5
    X, y = X[keep], y[keep]
    net = Net(5)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(150):
        i = torch.randint(len(y), (64,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(X[i]), y[i]).backward()
        opt.step()
    return net


def build(seed):
    model = _pretrained(seed)
    g = seed_all(seed)
    X, y = load_digits_std()
    model.head = nn.Linear(256, 10)
    opt = torch.optim.AdamW([{"params": model.backbone.parameters(), "lr": 1e-5},
                             {"params": model.head.parameters(), "lr": 2e-3}],
                            weight_decay=0.01)
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, 300, g), steps=300, num_classes=10,
                scaler=None, autocast=None, clip=None)
