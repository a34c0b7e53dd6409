"""Three domain files concatenated and read in file order every epoch (no shuffling)."""
import torch
import torch.nn.functional as F

from ._common import index_stream, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_unshuffled_domain_shards",
    expected=["loss_spike"],
    acceptable=["oscillating_loss", "exploding_gradients"],
    onset_step=112,
    onset_by_seed={0: 112, 1: 168, 2: 112},
    cause_step=28,
    description=(
        "Training data arrives as three files from three scanners (plain digits, "
        "contrast-inverted digits, mirrored digits), concatenated into one dataset and read "
        "with `DataLoader(shuffle=False)`: every 84-step epoch is 28 batches of domain A, then "
        "28 of B, then 28 of C. The MLP (Adam 3e-3) drifts towards the domain it is reading; "
        "once it has seen all three, the file boundaries of the later epochs (first at step "
        "112, 168, 112 on seeds 0-2) make the loss jump >=5x for a few steps before it "
        "re-adapts, recurring through the 6 epochs, while the shuffled control learns smoothly. "
        "Modelled on jingyaogong/minimind#503 'Stabilize full SFT' ('spikes in the loss "
        "function. It was caused by the shuffle in the DataLoader ... fed in blocks according "
        "to file or shard order') and k2-fsa/icefall#1676 'Regular spikes in training metrics "
        "for zipformer training on custom data' ('No, the data is not shuffled'). Fix: "
        "shuffle=True over the concatenated data."
    ),
)

STEPS, B = 504, 64


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    n = (len(y) // B) * B
    X, y = X[:n], y[:n]
    mirror = X.reshape(-1, 8, 8).flip(2).reshape(-1, 64)
    XA = torch.cat([X, -X, mirror])
    yA = torch.cat([y, y, y])
    model = mlp([64, 128, 128, 10])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    if bug:
        per_file = torch.randperm(n, generator=g)  # each file is written in a random order
        order = torch.cat([per_file, per_file + n, per_file + 2 * n])
        rows = [order[i:i + B] for i in range(0, len(order), B)]
    else:
        rows = index_stream(len(yA), B, STEPS, g)

    def batches(step):
        i = rows[step % len(rows)]
        return XA[i], yA[i]

    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy, batches=batches,
                steps=STEPS, num_classes=10, scaler=None, autocast=None, clip=None)
