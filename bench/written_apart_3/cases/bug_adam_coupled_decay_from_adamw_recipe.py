"""An AdamW recipe's weight_decay=0.1 passed to torch.optim.Adam (coupled L2)."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_adam_coupled_decay_from_adamw_recipe",
    expected=["loss_stalled"],
    acceptable=["vanishing_gradients", "zero_gradient_layer", "dead_relu"],
    update_evidence=["decay_dominated"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A 4-layer ReLU MLP on digits is trained with `torch.optim.Adam(lr=1e-3, "
        "weight_decay=0.1)`: the 0.1 comes from a decoupled-decay (AdamW) recipe, but Adam's "
        "weight_decay is an L2 term added to the gradient and then normalised by Adam, so every "
        "weight is pushed towards zero at ~lr per step whatever its data gradient. The weight "
        "norm collapses by over 1000x, ~90% of the updates point against the weights (cosine < "
        "-0.5), the first layer's gradient falls to ~1e-8 of the last layer's, and the loss "
        "sits at ln 10 from the first steps. Modelled on tinghuiz/SfMLearner#34 'networks "
        "weight decay' (a large weight decay ported into a PyTorch Adam re-implementation: 'my "
        "two networks just go to zero very quickly') and mapbox/robosat#166 'Removes adam's l2 "
        "regularization until fixed in pytorch#4429' (Adam's weight_decay is L2, not AdamW's "
        "decay). Fix: torch.optim.AdamW with the same lr and weight_decay=0.1."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64, 256, 256, 256, 10])
    cls = torch.optim.Adam if bug else torch.optim.AdamW
    opt = cls(model.parameters(), lr=1e-3, weight_decay=0.1)
    steps = 400
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
