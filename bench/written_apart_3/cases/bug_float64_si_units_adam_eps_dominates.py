"""float64 regression whose loss is computed in SI units (~1e-56): Adam's eps swamps the grads."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

BARN = 1e-28  # m^2

CASE = dict(
    name="bug_float64_si_units_adam_eps_dominates",
    expected=["loss_stalled"],
    acceptable=["vanishing_gradients"],
    update_evidence=["update_ratio_tiny"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A float64 emulator of cross-sections: the network predicts in barns, the output is "
        "converted to SI (x 1e-28 m^2) and the MSE is taken against SI targets, so the loss is "
        "~1e-56 and the gradients ~4e-56 - below float32's range (a float32 copy reads 0.0). "
        "float64 represents them, but Adam's eps=1e-8 dominates sqrt(v) ~ 1e-56, so each update "
        "is ~lr * g / eps ~ 1e-51: no parameter changes measurably and the loss is flat. Modelled "
        "on SciML/NeuralPDE.jl#582 'Second order ODE, simple supported beam problem' (the same "
        "problem stops converging when the length unit changes from m to mm) and "
        "lululxvi/deepxde#33 ('your PDE solution is not of scale O(1), which makes the training "
        "hard ... re-scale'). Fix: compute the loss in barns (targets / 1e-28)."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, _ = load_digits_std()
    X = X.double()
    gt = torch.Generator().manual_seed(9)
    w = torch.randn(64, generator=gt, dtype=torch.float64)
    z = X @ w
    z = ((z - z.mean()) / z.std()).clamp(-3, 3)
    sigma_si = torch.exp(0.3 * z) * BARN
    model = mlp([64, 128, 128, 1]).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if bug:
        def loss_fn(out, y):
            return F.mse_loss(out * BARN, y[:, None])
    else:
        def loss_fn(out, y):
            return F.mse_loss(out, y[:, None] / BARN)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=loss_fn,
                batches=dataset_batches(X, sigma_si, 64, steps, g), steps=steps,
                num_classes=None, scaler=None, autocast=None, clip=None)
