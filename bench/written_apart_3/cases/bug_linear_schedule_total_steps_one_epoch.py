"""Warmup-linear-decay schedule given one epoch's steps as num_training_steps."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_linear_schedule_total_steps_one_epoch",
    expected=["loss_stalled"],
    acceptable=[],
    update_evidence=["lr_zero"],
    onset_step=28,
    onset_by_seed={0: 28, 1: 32, 2: 28},
    cause_step=48,
    description=(
        "The transformers-style schedule `get_linear_schedule_with_warmup(opt, "
        "num_warmup_steps=5, num_training_steps=len(train_loader))` (re-implemented with "
        "LambdaLR) is given the steps of ONE epoch (48) for a 7-epoch run of 336 steps (plain "
        "SGD, peak LR 0.1): the LR reaches exactly 0 at step 48 and stays 0 (max(0, ...)), so "
        "the loss drops from 2.3 to ~1.4 during the first epoch and is flat from step ~30 on, "
        "while the control reaches ~0.17. Modelled on huggingface/transformers#26827 'Scheduler "
        "num_warmup_steps and num_training_steps' (the LR is 0 after half of max_train_steps "
        "because the step count given to the scheduler did not match how often it was stepped) "
        "and deepset-ai/FARM#46 'Wrong number of total steps for linear warmup schedule' "
        "('Training beyond specified t_total. Learning rate multiplier set to 0'). Fix: "
        "num_training_steps = epochs * len(train_loader)."
    ),
)

EPOCH = 48
EPOCHS = 7


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = mlp([64, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total = EPOCH if bug else EPOCH * EPOCHS
    warm = 5

    def lr_lambda(s):
        if s < warm:
            return float(s + 1) / warm
        return max(0.0, float(total - s) / float(max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    steps = EPOCH * EPOCHS
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 32, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None, scheduler=sched)
