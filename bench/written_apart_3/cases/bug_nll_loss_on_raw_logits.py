"""F.nll_loss applied to raw logits (the log_softmax was forgotten): a loss unbounded below."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_nll_loss_on_raw_logits",
    expected=["nan_or_inf"],
    acceptable=["exploding_gradients", "bad_initial_loss", "loss_diverging"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "Digits MLP whose loss is `F.nll_loss(model(x), y)` on raw logits (the model's "
        "LogSoftmax was removed when switching to logits, the loss was not switched to "
        "cross_entropy). nll_loss is then -mean(logit of the true class): unbounded below. With "
        "SGD momentum the logits, weights and gradients grow together (>=100x the initial "
        "gradient norm at ~58-61) until the forward overflows to -inf/NaN at ~73-78 and stays "
        "NaN. The loss is ~0 at step 0 (not ln 10) and negative afterwards. Modelled on "
        "mil-tokyo/MCD_DA#12 'Loss is becoming negative' ('Because the author used the "
        "nll_loss...') and keras-team/keras#2841 (an autoencoder whose loss goes to large "
        "negative values, then NaN). Fix: nll_loss(log_softmax(logits))."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64, 128, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if bug:
        def loss_fn(out, t):
            return F.nll_loss(out, t)
    else:
        def loss_fn(out, t):
            return F.nll_loss(torch.log_softmax(out, 1), t)
    steps = 200
    return dict(model=model, optimizer=opt, loss_fn=loss_fn,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
