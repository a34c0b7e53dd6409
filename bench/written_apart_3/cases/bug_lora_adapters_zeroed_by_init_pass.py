"""LoRA adapters injected before the model's init pass, which zero-inits both factors."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r=8, alpha=16):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(64, 128)
        self.l2 = nn.Linear(128, 128)
        self.act1, self.act2 = nn.ReLU(), nn.ReLU()
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.act2(self.l2(self.act1(self.l1(x)))))

    def init_weights(self):
        # the model's own init pass: bias-free projections are "residual outputs" -> zero init
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is None:
                nn.init.zeros_(m.weight)


CASE = dict(
    name="bug_lora_adapters_zeroed_by_init_pass",
    expected=["zero_gradient_layer"],
    acceptable=["loss_stalled"],
    update_evidence=["optimizer_param_without_grad"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "LoRA fine-tuning of a frozen MLP (base pretrained on a label-permuted digits task): "
        "LoRA adapters (A kaiming, B zeros) are injected into l1 and l2, the new 10-way head is "
        "trainable, and then the model's `init_weights()` runs, which zero-inits every bias-free "
        "nn.Linear (meant for residual output projections) - including both lora_A and lora_B. "
        "With A = B = 0 the gradient of each factor is the other factor times the upstream "
        "gradient, i.e. exactly zero on every step: the four adapter matrices never move while "
        "the head trains. Modelled on nvidia-cosmos/cosmos-predict2.5#15 'fix lora "
        "initialization problem. Original method leads lora-A initialization all zeros --> No "
        "training' (LoRA added before init_weights) and Guitaricet/relora#18 'Code bugs' (A and B "
        "both zero-initialised: 'the gradients for A and B would be zero all time'). Fix: inject "
        "the adapters after init_weights()."
    ),
)


def _base(seed):
    torch.manual_seed(3000 + seed)
    g = torch.Generator().manual_seed(4000 + seed)
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


def build(seed, bug=True):
    model = _base(seed)
    g = seed_all(seed)
    X, y = load_digits_std()
    for p in model.parameters():
        p.requires_grad = False
    model.l1 = LoRALinear(model.l1)
    model.l2 = LoRALinear(model.l2)
    model.head = nn.Linear(128, 10)
    if bug:
        model.init_weights()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=2e-3)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
