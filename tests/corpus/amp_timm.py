# timm-style training, after pytorch-image-models train.py: a small ResNet on scikit-learn's 8x8
# digits, mixed precision with autocast and a GradScaler hidden inside timm's NativeScaler
# (scale, backward, unscale_, clip_grad_norm_, step, update in one call), SGD with nesterov
# momentum, a cosine schedule stepped per update, label smoothing and a model EMA. The scaler is
# never handed to nnwatch: only the README's two lines were added.
from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from _record import record
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import nnwatch

parser = argparse.ArgumentParser(description='PyTorch ImageNet Training (digits)')
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('-b', '--batch-size', type=int, default=64)
parser.add_argument('--lr', type=float, default=0.1)
parser.add_argument('--momentum', type=float, default=0.9)
parser.add_argument('--weight-decay', type=float, default=5e-4)
parser.add_argument('--clip-grad', type=float, default=0.5)
parser.add_argument('--smoothing', type=float, default=0.1)
parser.add_argument('--amp', action='store_true', default=True)
parser.add_argument('--amp-dtype', default='bfloat16')
parser.add_argument('--model-ema-decay', type=float, default=0.99)
parser.add_argument('--seed', type=int, default=42)


class NativeScaler:
    """timm.utils.NativeScaler: the whole AMP backward in one call."""
    state_dict_key = "amp_scaler"

    def __init__(self, device='cuda'):
        self._scaler = torch.amp.GradScaler(device)

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        norm = None
        if clip_grad is not None:
            assert parameters is not None
            self._scaler.unscale_(optimizer)  # unscale the gradients of optimizer's params in-place
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()
        return norm

    def state_dict(self):
        return self._scaler.state_dict()


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.act2 = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        return self.act2(x + shortcut)


class ResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.global_pool(x), 1))


class ModelEmaV2(nn.Module):
    def __init__(self, model, decay=0.9999):
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.eval()
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values(), strict=True):
            if ema_v.dtype.is_floating_point:
                ema_v.mul_(self.decay).add_(model_v, alpha=1. - self.decay)
            else:
                ema_v.copy_(model_v)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, lr_scheduler, loss_scaler, model_ema, amp_autocast, w):
    model.train()
    num_updates = epoch * len(loader)
    for batch_idx, (input, target) in enumerate(loader):
        with amp_autocast():
            output = model(input)
            loss = loss_fn(output, target)
        optimizer.zero_grad()
        norm = loss_scaler(loss, optimizer, clip_grad=args.clip_grad, parameters=model.parameters())
        record(num_updates, norm, args.clip_grad)
        model_ema.update(model)
        num_updates += 1
        lr_scheduler.step()
        w.step(loss, batch=(input, target))
        if batch_idx % 10 == 0:
            print(f'Train: {epoch} [{batch_idx:>4d}/{len(loader)}]  Loss: {loss.item():#.3g}  '
                  f'LR: {optimizer.param_groups[0]["lr"]:.3e}')


def validate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for input, target in loader:
            correct += (model(input).argmax(1) == target).sum().item()
    print(f'Test: Acc@1 {100.0 * correct / len(loader.dataset):.2f}')


if __name__ == "__main__":
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    train_loader = DataLoader(TensorDataset(images[:1400], labels[:1400]), batch_size=args.batch_size,
                              shuffle=True, drop_last=True)
    eval_loader = DataLoader(TensorDataset(images[1400:], labels[1400:]), batch_size=256)
    model = ResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True,
                                weight_decay=args.weight_decay)
    amp_dtype = getattr(torch, args.amp_dtype)
    amp_autocast = (lambda: torch.autocast('cpu', dtype=amp_dtype)) if args.amp else None
    loss_scaler = NativeScaler('cpu')
    model_ema = ModelEmaV2(model, decay=args.model_ema_decay)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    train_loss_fn = lambda output, target: F.cross_entropy(output, target, label_smoothing=args.smoothing)  # noqa: E731
    train_start = time.perf_counter()
    with nnwatch.watch(model, optimizer, name="timm-amp") as w:
        for epoch in range(args.epochs):
            train_one_epoch(epoch, model, train_loader, optimizer, train_loss_fn, lr_scheduler, loss_scaler,
                            model_ema, amp_autocast, w)
            validate(model, eval_loader)
            validate(model_ema.module, eval_loader)
            torch.save({'state_dict': model.state_dict(), 'optimizer': optimizer.state_dict(),
                        loss_scaler.state_dict_key: loss_scaler.state_dict()}, 'checkpoint.pth.tar')
    print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")
