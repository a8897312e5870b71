"""Helpers for the convert-ckpt tests: real checkpoints written with torch, the CLI, bit-exact comparison."""

import argparse
import pathlib
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
from click.testing import CliRunner
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from migrate_fsdp.convert_ckpt.command import convert_ckpt


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.proj = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.head = nn.Linear(5, 3, bias=False)
        self.register_buffer("positions", torch.arange(7))

    def forward(self, tokens):
        return self.head(self.norm(self.proj(self.embed(tokens))))


def trained_net():
    """A model and its AdamW optimizer after two steps (so the optimizer state exists)."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.tensor([[1, 2, 3]])).sum().backward()
        optimizer.step()
    return model, optimizer


def full_checkpoint(**extras):
    """What FSDP1 code saves with FULL_STATE_DICT: model, FQN-keyed optimizer state, extras."""
    model, optimizer = trained_net()
    return {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, optimizer), **extras}


def rich_extras():
    return {
        "epoch": 3,
        "step": 120,
        "rng_state": torch.get_rng_state(),
        "cuda_rng_states": [torch.ones(4, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8)],
        "numpy_rng": np.random.RandomState(0).get_state(),
        "scheduler": {"step_size": 3, "gamma": 0.5, "base_lrs": [0.01], "last_epoch": 2, "_last_lr": [0.01]},
        "args": argparse.Namespace(lr=0.01, run="baseline"),
        "output_dir": pathlib.PurePosixPath("/runs/baseline"),
        "loss_scale": np.float64(65536.0),
    }


def cli(*args):
    """Run `migrate-fsdp convert-ckpt` in-process; returns click's result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(convert_ckpt, [str(a) for a in args], catch_exceptions=False)


def cli_process(*args, **kwargs) -> subprocess.CompletedProcess:
    """Run it as its own process, as a user would."""
    command = [sys.executable, "-m", "migrate_fsdp", "convert-ckpt", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)


def same(a, b, path="") -> list[str]:
    """Every difference between two loaded state trees; tensors compared byte for byte (dtype and shape too)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"]
        as_bytes = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
        return [] if torch.equal(as_bytes(a), as_bytes(b)) else [f"{path}: values differ"]
    if isinstance(a, dict) and isinstance(b, dict):
        problems = [f"{path}.{k}: missing on one side" for k in set(a) ^ set(b)]
        return problems + [p for k in a if k in b for p in same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in same(x, y, f"{path}[{i}]")]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype else [f"{path}: arrays differ"]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} vs {b!r}"]


def zeros_like_tree(tree):
    """A dcp.load template: the same structure, tensors zeroed, other values replaced by a placeholder."""
    if isinstance(tree, torch.Tensor):
        return torch.zeros_like(tree)
    if isinstance(tree, dict):
        return {k: zeros_like_tree(v) for k, v in tree.items()}
    if isinstance(tree, list) and any(isinstance(v, (torch.Tensor, dict, list)) for v in tree):
        return [zeros_like_tree(v) for v in tree]
    return None


def dcp_load(directory, reference):
    """dcp.load (single process) into a template shaped like `reference`; returns the filled template."""
    import torch.distributed.checkpoint as dcp

    template = zeros_like_tree(reference)
    dcp.load(template, checkpoint_id=str(directory), no_dist=True)
    return template
