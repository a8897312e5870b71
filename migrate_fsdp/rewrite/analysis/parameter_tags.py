"""Whether a program sets attributes of its own on parameters (`p._no_weight_decay = True`,
`m.weight.model_parallel = True`): FSDP1 with use_orig_params=True kept those Parameter objects, and so what was set
on them before wrapping; `fully_shard` makes new ones (construction restores them, emit.py).

Read from the text of every file of the program (the tagging code often names no FSDP: a module marking
model-parallel parameters), as the parameters are tagged: an attribute of `<module>.weight` / `.bias`, or of the
name a loop over `.parameters()` / `.named_parameters()` binds. Tensor attributes FSDP2 keeps (`requires_grad`) or
that other rules read (`data`, MF217; `grad`) are not tags.
"""

import re

_NOT_TAGS = frozenset({"data", "grad", "requires_grad"})
_ON_WEIGHTS = re.compile(rb"\.(?:weight|bias)\.([A-Za-z_]\w*)\s*=(?!=)")
_LOOP_NAME = re.compile(rb"\bfor\s+(?:\w+\s*,\s*)?(\w+)\s+in\s+[^\n]*?\.(?:named_)?parameters\(")


def tags_parameters(source: bytes) -> bool:
    if b"parameters(" not in source and b".weight." not in source and b".bias." not in source:
        return False
    if any(match.group(1).decode() not in _NOT_TAGS for match in _ON_WEIGHTS.finditer(source)):
        return True
    for name in {match.group(1) for match in _LOOP_NAME.finditer(source)}:
        setting = re.compile(rb"\b" + re.escape(name) + rb"\.([A-Za-z_]\w*)\s*=(?!=)")
        if any(match.group(1).decode() not in _NOT_TAGS for match in setting.finditer(source)):
            return True
        if re.search(rb"\bsetattr\(\s*" + re.escape(name) + rb"\s*,", source):
            return True
    return False
