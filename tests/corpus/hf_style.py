# Fine-tuning a sequence classifier with a hand-written loop, the way Hugging Face's
# run_glue_no_trainer.py and Trainer's inner loop do it: a model whose forward takes
# `**batch` and returns a dict with "loss" and "logits", AdamW over "decay" / "no_decay"
# parameter groups, get_linear_schedule_with_warmup (as a LambdaLR), gradient accumulation,
# clip_grad_norm_ with max_grad_norm, and label smoothing. The model is a small
# nn.TransformerEncoder and the data set is made up.
from __future__ import annotations

import argparse
import math
import time

import torch
from _record import record
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset

import nnwatch


class EncoderConfig:
    def __init__(self, vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=32, num_labels=2,
                 hidden_dropout_prob=0.1, label_smoothing_factor=0.1, pad_token_id=0):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.num_labels = num_labels
        self.hidden_dropout_prob = hidden_dropout_prob
        self.label_smoothing_factor = label_smoothing_factor
        self.pad_token_id = pad_token_id


class EncoderForSequenceClassification(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        layer = nn.TransformerEncoderLayer(
            config.hidden_size, config.num_attention_heads, config.intermediate_size,
            dropout=config.hidden_dropout_prob, activation="gelu", batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, config.num_hidden_layers)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        positions = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
        hidden_states = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        hidden_states = self.dropout(self.LayerNorm(hidden_states))
        padding_mask = attention_mask == 0 if attention_mask is not None else None
        hidden_states = self.encoder(hidden_states, src_key_padding_mask=padding_mask)
        pooled_output = hidden_states[:, 0]
        logits = self.classifier(pooled_output)

        loss = None
        if labels is not None:
            loss_fct = nn.CrossEntropyLoss(label_smoothing=self.config.label_smoothing_factor)
            loss = loss_fct(logits.view(-1, self.config.num_labels), labels.view(-1))
        return {"loss": loss, "logits": logits}


class ToyGlueDataset(Dataset):
    """Sentences of token ids; the label says whether token 7 occurs at least twice."""

    def __init__(self, size, max_length=24, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.examples = []
        for _ in range(size):
            length = int(torch.randint(8, max_length + 1, (1,), generator=g))
            ids = torch.randint(1, 16, (length,), generator=g)
            self.examples.append({"input_ids": ids, "label": int((ids == 7).sum() >= 2)})

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def data_collator(features):
    """Pads to the longest example in the batch (DataCollatorWithPadding)."""
    max_len = max(len(f["input_ids"]) for f in features)
    input_ids = torch.zeros(len(features), max_len, dtype=torch.long)
    attention_mask = torch.zeros(len(features), max_len, dtype=torch.long)
    for i, f in enumerate(features):
        input_ids[i, : len(f["input_ids"])] = f["input_ids"]
        attention_mask[i, : len(f["input_ids"])] = 1
    labels = torch.tensor([f["label"] for f in features])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, last_epoch=-1):
    def lr_lambda(current_step: int):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(
            0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps))
        )

    return LambdaLR(optimizer, lr_lambda, last_epoch)


def parse_args():
    parser = argparse.ArgumentParser(description="Finetune a transformers model on a text classification task")
    parser.add_argument("--per_device_train_batch_size", type=int, default=16)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--num_warmup_steps", type=int, default=5)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset = ToyGlueDataset(640, seed=1)
    eval_dataset = ToyGlueDataset(128, seed=2)
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=data_collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_dataset, collate_fn=data_collator,
                                 batch_size=args.per_device_eval_batch_size)

    model = EncoderForSequenceClassification(EncoderConfig())

    # Optimizer
    # Split weights in two groups, one with weight decay and the other not.
    no_decay = ["bias", "LayerNorm.weight", "norm1.weight", "norm2.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    # Scheduler and math around the number of training steps.
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=args.num_warmup_steps, num_training_steps=max_train_steps,
    )

    total_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps
    print("***** Running training *****")
    print(f"  Num examples = {len(train_dataset)}")
    print(f"  Num Epochs = {args.num_train_epochs}")
    print(f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}")
    print(f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}")
    print(f"  Total optimization steps = {max_train_steps}")
    completed_steps = 0

    train_start = time.perf_counter()
    with nnwatch.watch(model, optimizer, num_classes=2, name="hf-style") as w:
        for epoch in range(args.num_train_epochs):
            model.train()
            total_loss = 0.0
            for step, batch in enumerate(train_dataloader):
                outputs = model(**batch)
                loss = outputs["loss"]
                total_loss += loss.detach().float()
                loss = loss / args.gradient_accumulation_steps
                loss.backward()
                if (step + 1) % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1:
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    record(completed_steps, grad_norm, args.max_grad_norm)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                    w.step(loss, batch=batch["input_ids"])
                    completed_steps += 1

            model.eval()
            correct = 0
            for batch in eval_dataloader:
                with torch.no_grad():
                    outputs = model(**batch)
                predictions = outputs["logits"].argmax(dim=-1)
                correct += (predictions == batch["labels"]).sum().item()
            print(f"epoch {epoch}: accuracy {correct / len(eval_dataset):.3f} "
                  f"train_loss {total_loss.item() / len(train_dataloader):.4f} "
                  f"lr {lr_scheduler.get_last_lr()[0]:.2e}")
    print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")


if __name__ == "__main__":
    main()
