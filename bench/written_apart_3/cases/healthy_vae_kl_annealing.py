"""VAE with linear KL annealing: the logged loss rises while beta goes 0 -> 1."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_raw, seed_all

CASE = dict(
    name="healthy_vae_kl_annealing",
    expected=["healthy"],
    acceptable=[],
    learn_probe="recon_mse",
    description=(
        "A VAE on binarised digits (Bernoulli decoder, 8-d latent, Adam 1e-3) with KL "
        "warm-up: beta = 0 for 50 steps, then linear to 1 at step 250 (of 400) (Bowman et al. "
        "2016, 'Generating Sentences from a Continuous Space'). The logged loss is "
        "recon + beta*KL: it falls while beta ~ 0, then climbs for ~250 steps as the KL term "
        "is phased in, and flattens once beta = 1; the ELBO never halves, so progress is judged "
        "on the reconstruction error of a fixed evaluation batch (probe, verification only). "
        "num_classes=None."
    ),
)

STEPS, WARM, ANNEAL = 450, 150, 300


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
        self.dec = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 64))
        self.beta = 0.0

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def build(seed):
    g = seed_all(seed)
    Xr, _ = load_digits_raw()
    X = (Xr > 7).float()  # binarised digits
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    base = dataset_batches(X, X, 64, STEPS, g)
    step_box = [0]

    def batches(step):
        step_box[0] = step
        model.beta = min(1.0, max(0.0, (step - WARM) / (ANNEAL - WARM)))
        return base(step)

    def loss_fn(out, x):
        logits, mu, logvar = out
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / x.shape[0]
        kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp()) / x.shape[0]
        return rec + model.beta * kl

    xe = X[:256]

    def probe(m):
        mu, _ = m.enc(xe).chunk(2, dim=1)
        return {"recon_mse": float(F.mse_loss(torch.sigmoid(m.dec(mu)), xe))}

    return dict(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches, steps=STEPS,
                num_classes=None, scaler=None, autocast=None, clip=None, probe=probe)
