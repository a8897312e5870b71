"""A training script split over modules, as finetuning recipes are: the wrapping and the checkpoint live beside it.

Run: torchrun --nproc_per_node 2 train.py [--steps K] [--lr LR] [--save DIR]
Trains 5 steps by default, then saves a full checkpoint of the model and the optimizer with torch.save.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from checkpointing import save_full
from modeling import build

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--save", default="checkpoint")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
model = build()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
data = torch.Generator().manual_seed(1000 + rank)
for step in range(args.steps):
    x = torch.randn(8, 16, generator=data)
    loss = F.mse_loss(model(x), x.flip(1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
os.makedirs(args.save, exist_ok=True)
save_full(model, optimizer, os.path.join(args.save, "last.pt"))
dist.destroy_process_group()
