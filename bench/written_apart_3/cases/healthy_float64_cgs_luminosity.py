"""float64 regression whose loss is reported in cgs units (~1e67 erg^2/s^2): beyond float32."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

L_SUN = 3.828e33  # erg/s

CASE = dict(
    name="healthy_float64_cgs_luminosity",
    expected=["healthy"],
    acceptable=[],
    description=(
        "A float64 stellar-luminosity emulator: the network predicts in solar luminosities, the "
        "prediction is converted to erg/s (x 3.828e33) and the MSE is taken in cgs, as an "
        "astrophysics pipeline reports it. The loss is ~1.5e67 at the start and ~3e64 at the "
        "end and the gradient norm ~5e67 - far above float32's 3.4e38 (a float32 copy reads "
        "inf) but ordinary in float64; Adam is invariant to the scale, so training is the "
        "same as in solar units. num_classes=None."
    ),
)


def build(seed):
    g = seed_all(seed)
    X, _ = load_digits_std()
    X = X.double()
    gt = torch.Generator().manual_seed(9)
    w = torch.randn(64, generator=gt, dtype=torch.float64)
    z = X @ w
    z = ((z - z.mean()) / z.std()).clamp(-3, 3)
    lum = torch.exp(0.3 * z) * L_SUN
    model = mlp([64, 128, 128, 1]).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(out, y):
        return F.mse_loss(out * L_SUN, y[:, None])

    return dict(model=model, optimizer=opt, loss_fn=loss_fn,
                batches=dataset_batches(X, lum, 64, 300, g), steps=300, num_classes=None,
                scaler=None, autocast=None, clip=None)
