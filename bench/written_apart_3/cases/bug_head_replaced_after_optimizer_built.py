"""Transfer learning: the optimizer is built over the old head, then the head is replaced."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all


class Net(nn.Module):
    def __init__(self, n_out):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128),
                                      nn.ReLU())
        self.fc = nn.Linear(128, n_out)

    def forward(self, x):
        return self.fc(self.features(x))


CASE = dict(
    name="bug_head_replaced_after_optimizer_built",
    expected=["loss_stalled"],
    acceptable=["zero_gradient_layer", "exploding_gradients"],
    update_evidence=["grad_not_in_optimizer", "optimizer_param_without_grad",
                     "model_never_updated"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "Feature-extractor fine-tuning: a backbone pretrained on digits 0-4 is frozen "
        "(requires_grad=False), `optimizer = SGD(model.fc.parameters(), lr=0.05, momentum=0.9)` "
        "is created, and only then is `model.fc` replaced by a fresh 10-way nn.Linear. The "
        "optimizer holds the old 5-way head (frozen, no longer in the model, never gets a "
        "grad); the new head gets a gradient every step but is in no param group, so no weight "
        "of the model ever changes and the loss stays at its initial ~2.5-2.6; "
        "optimizer.zero_grad() clears only the stale head, so the new head's .grad accumulates "
        "(~100x its first norm by the end). Modelled on microsoft/nni#4521 'The parameters are "
        "not updated when the pruned model is finetuned' (layers replaced after the optimizer "
        "was built: 'the parameters registered in the optimizer are outdated ... reinitializing "
        "a new optimizer' fixed it). Fix: build the optimizer after replacing fc."
    ),
)


def _pretrained_backbone(seed):
    torch.manual_seed(1000 + seed)
    g = torch.Generator().manual_seed(2000 + seed)
    X, y = load_digits_std()
    keep = y < 5
    X, y = X[keep], y[keep]
    net = Net(5)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(120):
        i = torch.randint(len(y), (64,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(X[i]), y[i]).backward()
        opt.step()
    return net


def build(seed, bug=True):
    model = _pretrained_backbone(seed)
    g = seed_all(seed)
    X, y = load_digits_std()
    for p in model.parameters():
        p.requires_grad = False
    if bug:
        opt = torch.optim.SGD(model.fc.parameters(), lr=0.05, momentum=0.9)
        model.fc = nn.Linear(128, 10)
    else:
        model.fc = nn.Linear(128, 10)
        opt = torch.optim.SGD(model.fc.parameters(), lr=0.05, momentum=0.9)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
