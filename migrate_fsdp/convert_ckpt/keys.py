"""Renaming parameter FQNs: the wrapper prefixes FSDP2 does not have, then the user's `--rename` rules.

FSDP1 FULL state dicts already use clean FQNs, but checkpoints saved from
wrapped models carry the wrappers' attribute names: DDP's leading `module.`,
torch.compile's `_orig_mod.`, FSDP1's `_fsdp_wrapped_module.`, activation
checkpointing's `_checkpoint_wrapped_module.`. The last three never name a
user's module, so they go wherever they appear; `module.` only at the front
(a user's submodule may well be called `module`). This is the set
torch.distributed.checkpoint.state_dict's `_get_fqns` removes. The same
renaming applies to the optimizer state, keyed by the same FQNs.
"""

import re
from collections.abc import Mapping

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.structure import PARAM_GROUPS, PARAMS, STATE

WRAPPER_PARTS = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}
LEADING_PART = "module"


def parse_rename(spec: str) -> tuple[re.Pattern, str]:
    pattern, sep, replacement = spec.partition("=")
    if not sep or not pattern:
        raise ConvertError(f"--rename {spec!r}: expected REGEX=REPLACEMENT")
    try:
        return re.compile(pattern), replacement
    except re.error as error:
        raise ConvertError(f"--rename {spec!r}: bad regular expression: {error}") from None


class Renamer:
    def __init__(self, strip_prefixes: bool = True, rules=()):
        self.strip_prefixes = strip_prefixes
        self.rules = list(rules)

    def __call__(self, key: str) -> str:
        if self.strip_prefixes:
            parts = key.split(".")
            kept = [p for p in parts if p not in WRAPPER_PARTS]
            while len(kept) > 1 and kept[0] == LEADING_PART:
                kept.pop(0)
            if len(kept) < len(parts):  # else the key itself, not an equal copy: a million keys would be held twice
                key = ".".join(kept)
        for pattern, replacement in self.rules:
            try:
                key = pattern.sub(replacement, key)
            except (re.error, IndexError) as error:
                raise ConvertError(f"--rename {pattern.pattern}: {error}") from None
        return key


def rename_keys(mapping: Mapping, renamer: Renamer, what: str) -> dict:
    renamed: dict = {}
    for key, value in mapping.items():
        new = renamer(key)
        if new in renamed:
            first = next(k for k in mapping if renamer(k) == new)
            raise ConvertError(f"renaming makes two {what} keys one: {first!r} and {key!r} both become {new!r}")
        renamed[new] = value
    return renamed


def rename_optimizer(optimizer: Mapping, renamer: Renamer) -> dict:
    groups = []
    for group in optimizer[PARAM_GROUPS]:
        group = dict(group)
        group[PARAMS] = [renamer(p) for p in group.get(PARAMS, [])]
        groups.append(group)
    renamed = {k: v for k, v in optimizer.items() if k not in (STATE, PARAM_GROUPS)}
    renamed[STATE] = rename_keys(optimizer[STATE], renamer, "optimizer state")
    renamed[PARAM_GROUPS] = groups
    return {STATE: renamed.pop(STATE), PARAM_GROUPS: renamed.pop(PARAM_GROUPS), **renamed}
