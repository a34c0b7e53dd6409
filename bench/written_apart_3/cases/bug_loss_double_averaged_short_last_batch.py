"""Loss averaged twice over the batch; every epoch ends with a 2-sample batch."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_loss_double_averaged_short_last_batch",
    expected=["loss_spike"],
    acceptable=["exploding_gradients"],
    onset_step=28,
    onset_by_seed={0: 28, 1: 28, 2: 28},
    cause_step=28,
    description=(
        "Digits MLP, Adam lr 1e-3, batch 64 over 1794 samples with drop_last=False, so each "
        "28-step epoch ends with a 2-sample batch (steps 28, 57, 86, ...). The loss is divided "
        "by the batch size a second time (`F.cross_entropy(out, y) / x.shape[0]`, mean already "
        "taken), so its magnitude is inversely proportional to the batch size: the 2-sample "
        "batch reports a loss ~32x its neighbours and a gradient 400-480x the first steps' "
        "norm, once per epoch from step 28 on (Adam absorbs most of the step). num_classes=None "
        "(the logged value is not plain CE). Modelled on Stack Overflow 47824598 'Why does my "
        "training loss have regular spikes?' (spikes 'precisely once every 1390 training steps, "
        "which is exactly ... one full pass over my training dataset'; cause: the loss divided "
        "by the batch size twice plus a smaller last batch). Fix: a plain mean."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    X, y = X[:1794], y[:1794]
    model = mlp([64, 128, 128, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if bug:
        def loss_fn(out, t):
            return F.cross_entropy(out, t) / out.shape[0]
    else:
        loss_fn = F.cross_entropy
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=loss_fn,
                batches=dataset_batches(X, y, 64, steps, g, drop_last=False), steps=steps,
                num_classes=None, scaler=None, autocast=None, clip=None)
