"""ULMFiT-style gradual unfreezing: layers' requires_grad switched on one by one."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all

CASE = dict(
    name="healthy_gradual_unfreezing",
    expected=["healthy"],
    acceptable=[],
    description=(
        "Gradual unfreezing with discriminative learning rates (Howard & Ruder 2018, ULMFiT): "
        "a 3-layer backbone pretrained on a label-permuted digits task gets a new head; all "
        "parameters are in the optimizer from the start (one param group per layer, LR 1e-3 "
        "for the head down to 2.5e-4 for layer 1), but the backbone starts with "
        "requires_grad=False and its layers are unfrozen at steps 100 (l3), 200 (l2) and 300 "
        "(l1). Until then the optimizer holds parameters that get no gradient - on purpose."
    ),
)

UNFREEZE = {100: "l3", 200: "l2", 300: "l1"}
STEPS = 400


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 128)
        self.a1, self.a2, self.a3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.a3(self.l3(self.a2(self.l2(self.a1(self.l1(x)))))))


def _pretrained(seed):
    torch.manual_seed(9000 + seed)
    g = torch.Generator().manual_seed(9100 + seed)
    X, y = load_digits_std()
    perm = torch.randperm(10, generator=g)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(150):
        i = torch.randint(len(y), (64,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(X[i]), perm[y[i]]).backward()
        opt.step()
    return net


def build(seed):
    model = _pretrained(seed)
    g = seed_all(seed)
    X, y = load_digits_std()
    model.head = nn.Linear(128, 10)
    for name in ("l1", "l2", "l3"):
        for p in getattr(model, name).parameters():
            p.requires_grad = False
    opt = torch.optim.Adam([
        {"params": model.head.parameters(), "lr": 1e-3},
        {"params": model.l3.parameters(), "lr": 1e-3 / 2},
        {"params": model.l2.parameters(), "lr": 1e-3 / 2.6},
        {"params": model.l1.parameters(), "lr": 1e-3 / 4},
    ])
    base = dataset_batches(X, y, 64, STEPS, g)

    def batches(step):
        if step in UNFREEZE:
            for p in getattr(model, UNFREEZE[step]).parameters():
                p.requires_grad = True
        return base(step)

    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy, batches=batches,
                steps=STEPS, num_classes=10, scaler=None, autocast=None, clip=None)
