"""`migrate-fsdp verify`: run the FSDP1 and FSDP2 versions of a training script and prove they agree.

The package splits into two halves that share only the metrics file format:
the probe half runs inside every torchrun rank (`probe`, `recorder`,
`sharding`, `cpu_memory`), the driver half runs in the `verify` process
(`launcher`, `compare`, `tolerance`, the renderers and the suite).
"""
