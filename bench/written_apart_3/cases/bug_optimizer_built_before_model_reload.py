"""Resume script: optimizer built over one model object, then a new model is loaded."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_optimizer_built_before_model_reload",
    expected=["loss_stalled"],
    acceptable=["exploding_gradients", "zero_gradient_layer"],
    update_evidence=["model_never_updated", "grad_not_in_optimizer",
                     "optimizer_param_without_grad"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A resume path: `model = make_model(); optimizer = SGD(model.parameters(), 0.05, "
        "momentum=0.9)`, then `if resume: model = make_model(); "
        "model.load_state_dict(torch.load(ckpt))` re-binds `model` to a NEW object (checkpoint "
        "at loss ~1.6). The loop trains the new model with the old optimizer: optimizer.step() "
        "moves the orphaned parameters (which get no gradient), the live model never changes, so "
        "the loss stays at the checkpoint's level; optimizer.zero_grad() clears only the orphans, "
        "so the live model's .grad accumulates (norm grows ~linearly, >100x after ~100-200 "
        "steps). Modelled on NVIDIA/Megatron-LM#174 'Optimizer will hold unloaded model weights "
        "when model weights but not optimizer states are loaded from a checkpoint' (optimizer "
        "built before the checkpoint load holds the parameters of another model). Fix: build "
        "the optimizer after the model is loaded."
    ),
)


def _checkpoint(seed):
    torch.manual_seed(5000 + seed)
    g = torch.Generator().manual_seed(6000 + seed)
    X, y = load_digits_std()
    net = mlp([64, 128, 128, 10])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(20):
        i = torch.randint(len(y), (64,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(X[i]), y[i]).backward()
        opt.step()
    return {k: v.clone() for k, v in net.state_dict().items()}


def build(seed, bug=True):
    ckpt = _checkpoint(seed)
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64, 128, 128, 10])
    if bug:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model = mlp([64, 128, 128, 10])
        model.load_state_dict(ckpt)
    else:
        model.load_state_dict(ckpt)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
