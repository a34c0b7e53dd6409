"""Mean-teacher semi-supervised training: an EMA teacher inside the watched module."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="healthy_mean_teacher_ema",
    expected=["healthy"],
    acceptable=[],
    description=(
        "Mean Teacher (Tarvainen & Valpola 2017): the watched module holds a student and an "
        "EMA teacher (requires_grad=False, not in the optimizer, updated after every step by "
        "teacher = 0.99*teacher + 0.01*student under no_grad). Loss = CE on the labelled "
        "quarter of each batch + 2.0 * MSE between student and teacher softmax on noise-"
        "augmented views of the whole batch. The teacher's weights change every step without "
        "ever having a gradient - by design. num_classes=None (CE + consistency)."
    ),
)


class MeanTeacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = mlp([64, 128, 128, 10])
        self.teacher = copy.deepcopy(self.student)
        for p in self.teacher.parameters():
            p.requires_grad = False

    def forward(self, x):
        n1 = torch.randn_like(x) * 0.3
        n2 = torch.randn_like(x) * 0.3
        s = self.student(x + n1)
        with torch.no_grad():
            t = self.teacher(x + n2)
        return s, t

    @torch.no_grad()
    def ema_update(self, decay=0.99):
        for pt, ps in zip(self.teacher.parameters(), self.student.parameters(), strict=False):
            pt.mul_(decay).add_(ps, alpha=1 - decay)


STEPS = 400


def run(seed, bug, watch):
    g = seed_all(seed)
    X, y = load_digits_std()
    labelled = (torch.arange(len(y)) % 4 == 0)
    model = MeanTeacher()
    opt = torch.optim.Adam(model.student.parameters(), lr=1e-3)
    batches = dataset_batches(X, torch.arange(len(y)), 64, STEPS, g)
    w = watch(model, opt, num_classes=None, name="mean-teacher")
    try:
        for step in range(STEPS):
            xb, i = batches(step)
            opt.zero_grad(set_to_none=True)
            s, t = model(xb)
            lab = labelled[i]
            ce = F.cross_entropy(s[lab], y[i][lab])
            loss = ce + 2.0 * F.mse_loss(F.softmax(s, 1), F.softmax(t, 1))
            loss.backward()
            opt.step()
            model.ema_update()
            w.step(loss, batch=(xb, y[i]))
    finally:
        w.close()
    return {}
