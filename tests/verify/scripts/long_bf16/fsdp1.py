"""A long bf16 run: MixedPrecision, gradient accumulation under no_sync(), active clipping, AdamW.

The two versions differ by rounding every step (FSDP1 accumulates the
no_sync micro-batches in bf16, FSDP2 in fp32; the clip norms are summed in
another order), so verify judges the long trajectory against a control run.

Run: torchrun --nproc_per_node 2 fsdp1.py [--steps K] [--save PATH]
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, MixedPrecision, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

VOCAB, DIM, SEQ, BATCH = 64, 16, 8, 4
ACCUMULATE = 2
MAX_NORM = 0.2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save", help="save the full model and optimizer state here after training")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = FSDP(
        TinyLM(),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        device_id=torch.device("cpu"),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        for micro in range(ACCUMULATE):
            tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=data)
            with model.no_sync() if micro < ACCUMULATE - 1 else contextlib.nullcontext():
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) / ACCUMULATE
                loss.backward()
        norm = model.clip_grad_norm_(MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} grad norm {float(norm):.4f}")
    if args.save:
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer)}
        if rank == 0:
            torch.save(state, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
