"""MF219: a LOCAL_STATE_DICT setting on a model that converts: the files FSDP1 runs wrote do not load any more.

Under LOCAL_STATE_DICT, FSDP1 saved each rank's flat-parameter shards, and a plain `opt.state_dict()` beside it
held the optimizer state of those flat shards; the converted program saves and loads DTensor shards keyed by
parameter name (MF202), so it resumes from its own checkpoints, but a checkpoint an FSDP1 run wrote loads into
the wrong shapes (or fails at the first optimizer step). The conversion is right; the user must know that old
checkpoints need a full (FULL_STATE_DICT) copy saved by FSDP1 first, so it is reported, and the model converts.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS
from migrate_fsdp.rewrite.rules.training.base import TrainingRule

_SETTERS = ("state_dict_type", "set_state_dict_type")
_LOCAL = "torch.distributed.fsdp.StateDictType.LOCAL_STATE_DICT"


class LocalCheckpoints(TrainingRule):
    code = "MF219"
    name = "local-checkpoints"
    summary = "LOCAL_STATE_DICT checkpoints written by FSDP1 do not load into the converted model"
    reports_model_uses = False  # a heads-up on code that converts with its model: it holds nothing back
    heads_up = True
    tokens = ((b"LOCAL_STATE_DICT",),)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _SETTERS or len(node.args) < 2:
            return
        if not self.ctx.matches(func, *(f"{FSDP_CLASS}.{name}" for name in _SETTERS)):
            return
        model, kind = node.args[0].value, node.args[1].value
        if any(arg.keyword is not None or arg.star for arg in node.args[:2]):
            return
        if not self.ctx.matches(kind, _LOCAL):
            return
        if self.ctx.program.use(model, self.code, tuple(self.ctx.stack)) is not None:
            return  # the model stays FSDP1: its checkpoints stay what they were
        self.ctx.report(
            kind,
            self.code,
            "LOCAL_STATE_DICT checkpoints an FSDP1 run wrote (flat-parameter shards, and the optimizer state of "
            "them) do not load into the FSDP2 model; save a FULL_STATE_DICT copy with FSDP1 first "
            "(`migrate-fsdp convert-ckpt` converts it)",
        )
