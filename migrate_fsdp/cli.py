"""The `migrate-fsdp` command group.

Subcommands are imported only when invoked: `convert-ckpt` start-up time is
part of its speed goal, and `rewrite` should not pay for importing torch.
"""

import importlib

import click

from migrate_fsdp import __version__

# name -> "module:attribute" of a click command
_COMMANDS = {
    "rewrite": "migrate_fsdp.rewrite.command:rewrite",
    "verify": "migrate_fsdp.verify.command:verify",
    "convert-ckpt": "migrate_fsdp.convert_ckpt.command:convert_ckpt",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        target = _COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="migrate-fsdp")
def main():
    """Migrate PyTorch FSDP1 (FullyShardedDataParallel) code and checkpoints to FSDP2 (fully_shard)."""
