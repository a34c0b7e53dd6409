"""Knowledge distillation with a temperature-4 KL term scaled by T^2."""
import torch
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="healthy_distillation_t2_kl",
    expected=["healthy"],
    acceptable=[],
    description=(
        "Hinton-style distillation (Hinton, Vinyals, Dean 2015): a 256-wide teacher MLP is "
        "trained first (in build), then a 32-wide student minimises 0.3*CE(student, y) + "
        "0.7*T^2*KL(teacher_T || student_T) with T = 4, as in the usual PyTorch recipe. The T^2 "
        "factor keeps the soft-target gradients at the CE scale, but the logged loss is not a "
        "plain K-class cross-entropy: it starts at ~12.7 (not ln 10) and ends at ~0.17, above "
        "zero because the soft targets are never matched exactly. num_classes=None."
    ),
)

T = 4.0


def _teacher(seed):
    torch.manual_seed(7000 + seed)
    g = torch.Generator().manual_seed(8000 + seed)
    X, y = load_digits_std()
    net = mlp([64, 256, 256, 10])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(200):
        i = torch.randint(len(y), (128,), generator=g)
        opt.zero_grad()
        F.cross_entropy(net(X[i]), y[i]).backward()
        opt.step()
    for p in net.parameters():
        p.requires_grad = False
    return net.eval()


def build(seed):
    teacher = _teacher(seed)
    g = seed_all(seed)
    X, y = load_digits_std()
    with torch.no_grad():
        soft = torch.softmax(teacher(X) / T, dim=1)
    idx = torch.arange(len(y))
    student = mlp([64, 32, 10])
    opt = torch.optim.Adam(student.parameters(), lr=2e-3)
    base = dataset_batches(X, idx, 64, 400, g)

    def batches(step):
        x, i = base(step)
        return x, i

    def loss_fn(out, i):
        ce = F.cross_entropy(out, y[i])
        kl = F.kl_div(F.log_softmax(out / T, dim=1), soft[i], reduction="batchmean")
        return 0.3 * ce + 0.7 * T * T * kl

    return dict(model=student, optimizer=opt, loss_fn=loss_fn, batches=batches, steps=400,
                num_classes=None, scaler=None, autocast=None, clip=None)
