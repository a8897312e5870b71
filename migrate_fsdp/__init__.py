"""Move PyTorch training code and checkpoints from FSDP1 to FSDP2."""

__version__ = "0.1.0"
