"""fp16 AMP loop that clips the still-scaled gradients (no scaler.unscale_ before clipping)."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_amp_clip_before_unscale",
    expected=["clipping_misuse"],
    acceptable=["loss_stalled", "vanishing_gradients"],
    update_evidence=["update_ratio_tiny"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "run() loop (fp16 autocast + GradScaler on CPU, MLP on digits, SGD lr 0.05 momentum "
        "0.9): `scaler.scale(loss).backward(); clip_grad_norm_(model.parameters(), 1.0); "
        "scaler.step(opt)` with no `scaler.unscale_(opt)` before the clip. The clip sees the "
        "gradient times 65536 (norm ~3e4), scales it to norm 1, and scaler.step then divides by "
        "65536: every update is ~3e4x too small (update/weight ~6e-7 per step), the clip fires "
        "on every step with a pre-clip/max_norm ratio of ~3.2e4, and the loss stays at ln 10. "
        "Modelled on milesial/Pytorch-UNet#468 'Gradients are clipped before the unscaling' and "
        "victorchall/EveryDream2trainer#175 'correctly apply clip_grad_scale to unscaled "
        "gradients' (clipping the scaled gradients 'effectively halting training'). Fix: "
        "scaler.unscale_(opt) before clip_grad_norm_. The loop reports the pre-clip norm to the "
        "verification tracer only (a monitor ignores it)."
    ),
)

STEPS = 300


def run(seed, bug, watch):
    g = seed_all(seed)
    X, y = load_digits_std()
    batches = dataset_batches(X, y, 64, STEPS, g)
    model = mlp([64, 128, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    w = watch(model, opt, scaler=scaler, num_classes=10, name="amp-clip")
    try:
        for step in range(STEPS):
            xb, yb = batches(step)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(xb), yb)
            scaler.scale(loss).backward()
            if not bug:
                scaler.unscale_(opt)
            pre = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if hasattr(w, "note_clip"):  # verification tracer only
                w.note_clip(float(pre), 1.0)
            scaler.step(opt)
            scaler.update()
            w.step(loss, batch=(xb, yb))
    finally:
        w.close()
    return {}
