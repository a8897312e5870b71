"""Rules for how a model gets wrapped: FSDP(...) and its keyword arguments.

MF101 finds and rewrites the calls; each FSDP1 keyword has its own rule and
code (MF102-MF110), which MF101 applies; MF111 reports manual wrapping.
"""
