# Fine-tuning a sequence classifier with Accelerate, after transformers' examples
# run_glue_no_trainer.py: a (tiny, randomly initialised) BertForSequenceClassification on made-up
# token data, Accelerator with bf16 mixed precision and gradient accumulation through
# accelerator.accumulate(), accelerator.backward, accelerator.clip_grad_norm_ on sync steps,
# AdamW with weight-decay groups, a linear warmup schedule, the optimizer stepped on every
# micro-batch (Accelerate skips the update until the gradients sync), and the unwrapped model saved.
from __future__ import annotations

import argparse
import math
import time

import torch
from _record import record
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import BertConfig, BertForSequenceClassification, get_scheduler

import nnwatch


def parse_args():
    parser = argparse.ArgumentParser(description="Finetune a transformers model on a text classification task")
    parser.add_argument("--per_device_train_batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--lr_scheduler_type", default="linear")
    parser.add_argument("--num_warmup_steps", type=int, default=4)
    parser.add_argument("--max_grad_norm", type=float, default=0.12)
    parser.add_argument("--output_dir", default="out")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision="bf16", cpu=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(5, 128, (384, 16), generator=g)
    labels = (input_ids[:, 1] > 66).long()  # learnable: the first real token decides
    attention_mask = torch.ones_like(input_ids)
    train_dataloader = DataLoader(TensorDataset(input_ids, attention_mask, labels), shuffle=True,
                                  batch_size=args.per_device_train_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(name=args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    completed_steps = 0
    train_start = time.perf_counter()
    with nnwatch.watch(model, optimizer, num_classes=2, name="accelerate-glue") as w:
        for epoch in range(args.num_train_epochs):
            model.train()
            for step, (ids, mask, y) in enumerate(train_dataloader):
                with accelerator.accumulate(model):
                    outputs = model(input_ids=ids, attention_mask=mask, labels=y)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                        record(completed_steps, norm, args.max_grad_norm)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    completed_steps += 1
                    w.step(loss, batch=ids)
                if step % 8 == 0:
                    accelerator.print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
        accelerator.wait_for_everyone()
        unwrapped_model = accelerator.unwrap_model(model)
        unwrapped_model.save_pretrained(args.output_dir, save_function=accelerator.save)
    print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")


if __name__ == "__main__":
    main()
