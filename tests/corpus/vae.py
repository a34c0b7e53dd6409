# ruff: noqa: UP032 -- the str.format calls of the code this file imitates, kept on purpose
# Variational auto-encoder, after pytorch/examples vae/main.py, on scikit-learn's 8x8 digits:
# the reparameterization trick, a summed BCE + KL divergence loss, Adam, and
# torch.nn.utils.clip_grad_value_ before each update.
from __future__ import annotations

import argparse
import time

import torch
import torch.utils.data
from _record import grad_norm, record
from sklearn.datasets import load_digits
from torch import nn, optim
from torch.nn import functional as F

import nnwatch

parser = argparse.ArgumentParser(description='VAE MNIST Example')
parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                    help='input batch size for training (default: 64)')
parser.add_argument('--epochs', type=int, default=4, metavar='N',
                    help='number of epochs to train (default: 4)')
parser.add_argument('--seed', type=int, default=1, metavar='S',
                    help='random seed (default: 1)')
parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                    help='how many batches to wait before logging training status')
parser.add_argument('--clip-value', type=float, default=5.0,
                    help='clip each gradient element to [-v, v]')
args = parser.parse_args()

torch.manual_seed(args.seed)
torch.set_num_threads(1)
device = torch.device("cpu")

digits = load_digits()
pixels = torch.tensor(digits.data, dtype=torch.float32) / 16.0
labels = torch.tensor(digits.target)
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(pixels[:1400], labels[:1400]),
    batch_size=args.batch_size, shuffle=True)
test_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(pixels[1400:], labels[1400:]),
    batch_size=args.batch_size, shuffle=False)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()

        self.fc1 = nn.Linear(64, 48)
        self.fc21 = nn.Linear(48, 8)
        self.fc22 = nn.Linear(48, 8)
        self.fc3 = nn.Linear(8, 48)
        self.fc4 = nn.Linear(48, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5*logvar)
        eps = torch.randn_like(std)
        return mu + eps*std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE().to(device)
optimizer = optim.Adam(model.parameters(), lr=1e-3)


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction='sum')

    # see Appendix B from VAE paper:
    # Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
    # https://arxiv.org/abs/1312.6114
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    return BCE + KLD


def train(epoch):
    global updates
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        record(updates, grad_norm(model.parameters()), how="value")
        torch.nn.utils.clip_grad_value_(model.parameters(), args.clip_value)
        train_loss += loss.item()
        optimizer.step()
        w.step(loss, batch=data)
        updates += 1
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader),
                loss.item() / len(data)))

    print('====> Epoch: {} Average loss: {:.4f}'.format(
          epoch, train_loss / len(train_loader.dataset)))


def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for data, _ in test_loader:
            data = data.to(device)
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()

    test_loss /= len(test_loader.dataset)
    print('====> Test set loss: {:.4f}'.format(test_loss))


if __name__ == "__main__":
    updates = 0
    train_start = time.perf_counter()
    with nnwatch.watch(model, optimizer, name="vae") as w:
        for epoch in range(1, args.epochs + 1):
            train(epoch)
            test(epoch)
            with torch.no_grad():
                sample = torch.randn(64, 8).to(device)
                sample = model.decode(sample).cpu()
    print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")
