"""A small data-parallel training script that misbehaves on request, for verify's fault tests.

Run: torchrun --nproc_per_node 2 faulty.py --fault {none,crash,hang,no-step,short,uneven} [--tag TAG]
(--tag only marks the processes, so that a test can look for leftovers.)
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--fault", default="none", choices=["none", "crash", "hang", "no-step", "short", "uneven"])
parser.add_argument("--tag", default="")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank)
for step in range(2 if args.fault == "short" or (args.fault == "uneven" and rank == 1) else 100):
    x = torch.randn(4, 8, generator=data)
    loss = model(x).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    if step == 1 and args.fault == "crash" and rank == 1:
        raise RuntimeError("injected failure on rank 1")
    if step == 1 and args.fault == "hang" and rank == 0:
        time.sleep(3600)
    if args.fault != "no-step":
        optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
