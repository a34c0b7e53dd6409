"""Adam with betas=(0.999, 0.9): beta1 and beta2 swapped."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_adam_betas_swapped",
    expected=["exploding_gradients"],
    acceptable=["loss_spike", "loss_diverging", "oscillating_loss", "nan_or_inf", "dead_relu",
                "loss_stalled"],
    update_evidence=[],
    onset_step=248,
    onset_by_seed={0: 248, 1: 185, 2: 141},
    cause_step=0,
    description=(
        "MLP on digits, `Adam(lr=3e-3, betas=(0.999, 0.9))` (the two betas swapped when copied "
        "from a config). The first moment averages over ~1000 steps while the second moment "
        "forgets after ~10: once the loss is small, m/sqrt(v) becomes large, updates keep "
        "pushing in stale directions, the weight norm grows 4000-6000x, the loss jumps back up "
        "(first spike at step 141-248; on one seed it ends at ~7000) and the gradient norm "
        "reaches 7e4-1e7x its initial value. Modelled on mila-iqia/blocks#1159 'Adam moment "
        "parameterization is backwards' (betas given in the other convention: 'my second moment "
        "estimates decayed faster than an anxious squirrel'). Fix: betas=(0.9, 0.999)."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64, 128, 128, 10])
    betas = (0.999, 0.9) if bug else (0.9, 0.999)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=betas)
    steps = 400
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
