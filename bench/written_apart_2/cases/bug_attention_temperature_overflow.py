"""Bug: an attention-pooling classifier whose scores are divided by a temperature of 1e-3 (meant for
a contrastive head) instead of sqrt(d), under fp16 autocast. As q and k grow, the fp16 scores pass
65504, become inf, and softmax(inf - inf) gives NaN."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_attention_temperature_overflow", expected=["nan_or_inf"],
    acceptable=["amp_scale_collapse", "loss_stalled", "exploding_gradients"], onset_step=43,
    onset_by_seed={0: 43, 1: 2, 2: 168},
    description="Digits split into 16 patches of 4 pixels, patch embedding d=32 + learned positions, one "
                "self-attention layer with scores = q k^T / tau, tau = 1e-3 (bug; fixed: tau = sqrt(32)), mean "
                "pool, Linear(32,10). fp16 autocast on CPU with GradScaler, Adam 2e-3, batch 64, 300 steps.",
)


class AttnNet(nn.Module):
    def __init__(self, tau):
        super().__init__()
        self.tau = tau
        self.embed = nn.Linear(4, 32)
        self.pos = nn.Parameter(0.1 * torch.randn(16, 32))
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = self.embed(x.view(-1, 16, 4)) + self.pos
        s = self.q(h) @ self.k(h).transpose(1, 2) / self.tau
        a = torch.softmax(s, -1)
        h = h + a @ self.v(h)
        return self.head(h.mean(1))


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = AttnNet(1e-3 if bug else 32 ** 0.5)
    steps = 300
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3), loss_fn=F.cross_entropy,
                batches=fixed_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=torch.amp.GradScaler("cpu"), autocast=dict(device_type="cpu", dtype=torch.float16), clip=None)
