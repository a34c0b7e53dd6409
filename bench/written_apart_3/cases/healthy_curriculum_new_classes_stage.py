"""Class-incremental curriculum: stage 1 sees digits 0-4, stage 2 (step 100) all ten classes."""
import torch
import torch.nn.functional as F

from ._common import index_stream, load_digits_std, mlp, seed_all

CASE = dict(
    name="healthy_curriculum_new_classes_stage",
    expected=["healthy"],
    acceptable=[],
    description=(
        "Curriculum learning (easy-to-hard staging as in Bengio et al. 2009 and class-incremental "
        "schedules): a digits MLP, SGD lr 0.02 momentum 0.9, batch 64, trains on classes 0-4 "
        "only for 100 steps (loss ~2.3 -> ~0.03), then on all ten classes for 400 steps. At the "
        "stage change the batch loss jumps ~70x (to ~2.2; the new classes are predicted as old "
        "ones with confidence) and stays high for dozens of steps while the new classes are "
        "learnt, then falls to ~0.015. Correct by design: the jump is the new data."
    ),
)

STAGE, STEPS = 100, 500


def build(seed):
    g = seed_all(seed)
    X, y = load_digits_std()
    easy = torch.nonzero(y < 5).squeeze(1)
    idx_easy = index_stream(len(easy), 64, STAGE, g)
    idx_all = index_stream(len(y), 64, STEPS - STAGE, g)

    def batches(step):
        if step < STAGE:
            i = easy[idx_easy[step]]
        else:
            i = idx_all[step - STAGE]
        return X[i], y[i]

    model = mlp([64, 128, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy, batches=batches,
                steps=STEPS, num_classes=10, scaler=None, autocast=None, clip=None)
