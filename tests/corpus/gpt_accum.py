"""
This training script imitates nanoGPT's train.py on a tiny char-level data set
(shakespeare_char, made up here): gradient accumulation over micro-batches,
grad clipping, AdamW with decay / no-decay groups, a cosine LR with warmup set by hand,
periodic evaluation and a checkpoint.

To run on a single CPU, example:
$ python tests/corpus/gpt_accum.py --max_iters=60
"""

from __future__ import annotations

import math
import os
import sys
import time
from ast import literal_eval
from contextlib import nullcontext

import numpy as np
import torch
from _record import record
from nanogpt_model import GPT, GPTConfig
from torch.nn.utils import clip_grad_norm_

import nnwatch

# -----------------------------------------------------------------------------
# default config values designed to train a baby char-level GPT on a CPU
out_dir = 'out'
eval_interval = 20
log_interval = 10
eval_iters = 4
always_save_checkpoint = True
# data
gradient_accumulation_steps = 4 # used to simulate larger batch sizes
batch_size = 8 # if gradient_accumulation_steps > 1, this is the micro-batch size
block_size = 32
# model
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.1
bias = True # do we use bias inside LayerNorm and Linear layers?
# adamw optimizer
learning_rate = 1e-3 # max learning rate
max_iters = 40 # total number of training iterations
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0 # clip gradients at this value, or disable if == 0.0
# learning rate decay settings
decay_lr = True # whether to decay the learning rate
warmup_iters = 5 # how many steps to warm up for
lr_decay_iters = 40 # should be ~= max_iters per Chinchilla
min_lr = 1e-4 # minimum learning rate, should be ~= learning_rate/10 per Chinchilla
device = 'cpu'
dtype = 'float32'
# -----------------------------------------------------------------------------
# poor man's configurator: --key=value overrides the globals above
for arg in sys.argv[1:]:
    assert arg.startswith('--') and '=' in arg, arg
    key, val = arg[2:].split('=', 1)
    assert key in globals(), f"Unknown config key: {key}"
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    print(f"Overriding: {key} = {attempt}")
    globals()[key] = attempt
# -----------------------------------------------------------------------------

tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
print(f"tokens per iteration will be: {tokens_per_iter:,}")

os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(1337)
torch.set_num_threads(1)
device_type = 'cuda' if 'cuda' in device else 'cpu' # for later use in torch.autocast
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# the "shakespeare_char" data set, made up: prepare.py would write train.bin / val.bin
rng = np.random.default_rng(1337)
words = ["thou", "art", "the", "king", "of", "my", "heart", "and", "soul", "speak", "now", "lord",
         "what", "is", "love", "tis", "not", "here", "hence", "away", "good", "night", "sweet"]
text = " ".join(rng.choice(words, size=6000)) + "\n"
chars = sorted(set(text))
vocab_size = len(chars)
stoi = {ch: i for i, ch in enumerate(chars)}
data = np.array([stoi[c] for c in text], dtype=np.uint16)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]

def get_batch(split):
    data = train_data if split == 'train' else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])
    x, y = x.to(device), y.to(device)
    return x, y

# init these up here, can override if init_from='resume' (i.e. from a checkpoint)
iter_num = 0
best_val_loss = 1e9

# model init
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                  bias=bias, vocab_size=vocab_size, dropout=dropout)
gptconf = GPTConfig(**model_args)
model = GPT(gptconf)
model.to(device)

# optimizer
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)

# helps estimate an arbitrarily accurate loss over either split using many batches
@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out

# learning rate decay scheduler (cosine with warmup)
def get_lr(it):
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)

# training loop
X, Y = get_batch('train') # fetch the very first batch
t0 = time.time()
train_start = time.perf_counter()
local_iter_num = 0 # number of iterations in the lifetime of this process
with nnwatch.watch(model, optimizer, name="nanogpt-char") as w:
    while True:

        # determine and set the learning rate for this iteration
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for param_group in optimizer.param_groups:
            param_group['lr'] = lr

        # evaluate the loss on train/val sets and write checkpoints
        if iter_num % eval_interval == 0:
            losses = estimate_loss()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if losses['val'] < best_val_loss or always_save_checkpoint:
                best_val_loss = losses['val']
                if iter_num > 0:
                    print(f"saving checkpoint to {out_dir}")
                    torch.save(model, os.path.join(out_dir, 'ckpt.pt'))
        if iter_num == max_iters:
            break

        # forward backward update, with optional gradient accumulation to simulate larger batch size
        for micro_step in range(gradient_accumulation_steps):  # noqa: B007 (as in nanoGPT)
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps # scale the loss to account for gradient accumulation
            # immediately async prefetch next batch while model is doing the forward pass on the GPU
            X, Y = get_batch('train')
            # backward pass
            loss.backward()
        # clip the gradient
        if grad_clip != 0.0:
            norm = clip_grad_norm_(model.parameters(), grad_clip)
            record(iter_num, norm, grad_clip)
        # step the optimizer
        optimizer.step()
        # flush the gradients as soon as we can, no need for this memory anymore
        optimizer.zero_grad(set_to_none=True)

        # timing and logging
        w.step(loss)
        t1 = time.time()
        dt = t1 - t0
        t0 = t1
        if iter_num % log_interval == 0:
            # get loss as float. note: this is a CPU-GPU sync point
            # scale up to undo the division above, approximating the true total loss (exact would have been a sum)
            lossf = loss.item() * gradient_accumulation_steps
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms")
        iter_num += 1
        local_iter_num += 1

print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")
