"""The FSDP2 migration of fsdp1.py: MixedPrecisionPolicy, set_requires_gradient_sync(False), clip_grad_norm_.

The two versions differ by rounding every step (FSDP1 accumulates the
no_sync micro-batches in bf16, FSDP2 in fp32; the clip norms are summed in
another order), so verify judges the long trajectory against a control run.

Run: torchrun --nproc_per_node 2 fsdp2.py [--steps K] [--save PATH]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

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
    model = TinyLM()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        for micro in range(ACCUMULATE):
            tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=data)
            model.set_requires_gradient_sync(micro == ACCUMULATE - 1)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)) / ACCUMULATE
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).full_tensor()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} grad norm {float(norm):.4f}")
    if args.save:
        options = StateDictOptions(full_state_dict=True)
        state = {"model": get_model_state_dict(model, options=options),
                 "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}
        if rank == 0:
            torch.save(state, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
