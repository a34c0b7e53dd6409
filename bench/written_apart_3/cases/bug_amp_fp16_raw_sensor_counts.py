"""fp16 autocast + GradScaler on raw 10-bit sensor counts (0..1024), no input scaling."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_raw, mlp, seed_all

CASE = dict(
    name="bug_amp_fp16_raw_sensor_counts",
    expected=["amp_scale_collapse"],
    acceptable=["nan_or_inf", "bad_initial_loss", "loss_stalled"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "fp16 autocast with torch.amp.GradScaler('cpu') on inputs that are raw 10-bit sensor "
        "counts (digits pixels x 64, up to 1024) fed to a 256-wide MLP without normalisation. "
        "The first loss is ~56-76 (ln 10 = 2.3); the scaler skips the first overflowing steps, "
        "the few updates that do go through push the fp16 activations past 65504, the forward "
        "then produces inf/NaN on every step, every step is skipped and the scale halves below "
        "1 at step ~17 and on to 0. Modelled on NVIDIA/apex#318 'How to handle gradient "
        "overflow when training a deep model with mixed precision?' ('Gradient overflow. "
        "Skipping step, loss scaler 0 reducing loss scale to 1.35807730622e-312'). Fix: scale "
        "the inputs to [0, 1]."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    Xr, y = load_digits_raw()
    X = Xr * 64.0 if bug else Xr / 16.0
    model = mlp([64, 256, 256, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = 200
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=torch.amp.GradScaler("cpu"),
                autocast=dict(device_type="cpu", dtype=torch.float16), clip=None)
