# A language-model-style loop that dies in its own logging code, the way real scripts do:
# the perplexity is computed with math.exp on the summed (not averaged) loss of the last
# log interval, and at step 20 that overflows. The OverflowError is raised from the user's
# code inside the watched block and is not caught: the run must be recorded as crashed.
from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import nnwatch

torch.manual_seed(0)
torch.set_num_threads(1)

vocab, emb, hid, bptt, bsz = 64, 32, 64, 16, 16
data = torch.randint(vocab, (4096,))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.fc = nn.Linear(emb, hid)
        self.out = nn.Linear(hid, vocab)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(self.embed(x))))


model = TinyLM()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
log_interval = 20

total_loss = 0.0
start = time.time()
with nnwatch.watch(model, optimizer, name="crash") as w:
    for step in range(100):
        i = (step * bptt * bsz) % (len(data) - bptt * bsz - 1)
        chunk = data[i:i + bptt * bsz + 1]
        x, y = chunk[:-1].view(bsz, bptt), chunk[1:].view(bsz, bptt)
        optimizer.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, vocab), y.reshape(-1), reduction="sum")
        loss.backward()
        optimizer.step()
        w.step(loss, batch=(x, y))
        total_loss += loss.item()
        if step % log_interval == 0 and step > 0:
            cur_loss = total_loss / log_interval  # a sum over the tokens of 20 batches
            print(f"step {step} | loss {cur_loss:.2f} | ppl {math.exp(cur_loss):.2f} | {time.time() - start:.2f}s")
            total_loss = 0.0
            start = time.time()
