"""Vanilla tanh RNN on the adding problem, SGD+momentum, no gradient clipping: gradients explode."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import seed_all

CASE = dict(
    name="bug_rnn_adding_no_clip",
    expected=["exploding_gradients"],
    acceptable=["nan_or_inf", "loss_diverging", "oscillating_loss", "bad_initial_loss", "vanishing_gradients"],
    onset_step=57,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 57, 1: 29, 2: 21},
    description="nn.RNN(tanh, 64 hidden) with an orthogonal W_hh (gain 1, the edge of stability) on the "
                "adding problem (Hochreiter & Schmidhuber; T=50, two marked numbers to sum), MSE, "
                "SGD(lr=0.05, momentum=0.9) and no clip_grad_norm_ (Pascanu et al. 2013: training "
                "pushes the recurrence across a bifurcation and the gradient norm jumps by many "
                "orders of magnitude between consecutive steps). The grad norm spikes >=100x within "
                "the first 20-60 steps, then the weights overflow to NaN. Fixed: clip at 1.0.",
)


class AddRNN(nn.Module):
    def __init__(self, H=64):
        super().__init__()
        self.rnn = nn.RNN(2, H, batch_first=True)
        self.out = nn.Linear(H, 1)
        with torch.no_grad():
            nn.init.orthogonal_(self.rnn.weight_hh_l0, gain=1.0)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h[:, -1])


def build(seed, bug=True):
    g = seed_all(seed)
    steps, T, B = 300, 50, 64
    data = []
    for _ in range(steps):
        v = torch.rand(B, T, generator=g)
        m = torch.zeros(B, T)
        for b in range(B):
            m[b, torch.randperm(T, generator=g)[:2]] = 1
        data.append((torch.stack([v, m], -1), (v * m).sum(1, keepdim=True)))
    model = AddRNN()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                loss_fn=F.mse_loss, batches=lambda s: data[s], steps=steps, num_classes=None, scaler=None,
                autocast=None, clip=None if bug else 1.0)
