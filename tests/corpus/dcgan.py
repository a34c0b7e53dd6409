# ruff: noqa: UP031 -- the percent formatting of the code this file imitates, kept on purpose
# DCGAN, after pytorch/examples dcgan/main.py, shrunk to 8x8 digits from scikit-learn:
# a generator and a discriminator with their own Adam optimizers (beta1 = 0.5), one D step and
# one G step per iteration, the generator's gradients clipped with torch's clip_grad_norm_,
# a fixed-noise sample now and then, and both state_dicts checkpointed each epoch.
from __future__ import annotations

import argparse
import os
import random
import time

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data
from _record import record
from sklearn.datasets import load_digits

import nnwatch

parser = argparse.ArgumentParser()
parser.add_argument('--batchSize', type=int, default=64, help='input batch size')
parser.add_argument('--nz', type=int, default=16, help='size of the latent z vector')
parser.add_argument('--ngf', type=int, default=16)
parser.add_argument('--ndf', type=int, default=16)
parser.add_argument('--niter', type=int, default=2, help='number of epochs to train for')
parser.add_argument('--lr', type=float, default=0.0002, help='learning rate, default=0.0002')
parser.add_argument('--beta1', type=float, default=0.5, help='beta1 for adam. default=0.5')
parser.add_argument('--clipG', type=float, default=1.0, help='max grad norm of the generator')
parser.add_argument('--outf', default='.', help='folder to output images and model checkpoints')
parser.add_argument('--manualSeed', type=int, default=999, help='manual seed')

opt = parser.parse_args()
print(opt)

os.makedirs(opt.outf, exist_ok=True)

print("Random Seed: ", opt.manualSeed)
random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)
torch.set_num_threads(1)

digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # [-1, 1]
dataset = torch.utils.data.TensorDataset(images, torch.tensor(digits.target))
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True)

device = torch.device("cpu")
nz = int(opt.nz)
ngf = int(opt.ngf)
ndf = int(opt.ndf)
nc = 1


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            # input is Z, going into a convolution
            nn.ConvTranspose2d(     nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # state size. (ngf*2) x 4 x 4
            nn.ConvTranspose2d(ngf * 2,      nc, 4, 2, 1, bias=False),
            nn.Tanh()
            # state size. (nc) x 8 x 8
        )

    def forward(self, input):
        output = self.main(input)
        return output


netG = Generator().to(device)
netG.apply(weights_init)
print(netG)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            # input is (nc) x 8 x 8
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf) x 4 x 4
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*2) x 2 x 2
            nn.Conv2d(ndf * 2, 1, 2, 1, 0, bias=False),
            nn.Sigmoid()
        )

    def forward(self, input):
        output = self.main(input)
        return output.view(-1, 1).squeeze(1)


netD = Discriminator().to(device)
netD.apply(weights_init)
print(netD)

criterion = nn.BCELoss()

fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)
real_label = 1
fake_label = 0

# setup optimizer
optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

updates = 0
train_start = time.perf_counter()
with nnwatch.watch(netG, optimizerG, name="dcgan-G") as w:
    for epoch in range(opt.niter):
        for i, data in enumerate(dataloader, 0):
            ############################
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            ###########################
            # train with real
            netD.zero_grad()
            real_cpu = data[0].to(device)
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label,
                               dtype=real_cpu.dtype, device=device)

            output = netD(real_cpu)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()

            # train with fake
            noise = torch.randn(batch_size, nz, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            D_G_z1 = output.mean().item()
            errD = errD_real + errD_fake
            optimizerD.step()

            ############################
            # (2) Update G network: maximize log(D(G(z)))
            ###########################
            netG.zero_grad()
            label.fill_(real_label)  # fake labels are real for generator cost
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()
            normG = torch.nn.utils.clip_grad_norm_(netG.parameters(), opt.clipG)
            record(updates, normG, opt.clipG)
            optimizerG.step()
            w.step(errG)
            updates += 1

            if i % 10 == 0:
                print('[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f'
                      % (epoch, opt.niter, i, len(dataloader),
                         errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))
            if i % 20 == 0:
                fake = netG(fixed_noise)
                torch.save(fake.detach(), '%s/fake_samples_epoch_%03d.pt' % (opt.outf, epoch))

        # do checkpointing
        torch.save(netG.state_dict(), '%s/netG_epoch_%d.pth' % (opt.outf, epoch))
        torch.save(netD.state_dict(), '%s/netD_epoch_%d.pth' % (opt.outf, epoch))
print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")
