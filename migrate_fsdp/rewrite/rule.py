"""The contract between the engine and a rule.

A rule is a small class with a stable code. The engine runs every selected
rule in one traversal of the file (metadata is built once per file), calling
the hooks a rule defines, by node type name:

- ``collect_<Node>(node)``: a read-only pass over the whole file that runs
  before any rewriting, for facts a rule needs ahead of use (which names hold
  FSDP1 models, which dicts feed ``**kwargs``).
- ``visit_<Node>(node)`` and ``leave_<Node>(original, updated)``: the
  rewriting pass, as in a LibCST transformer. Several rules may hook the same
  node type; they run in registry order, each getting the previous result,
  until one returns a node of another type.

Metadata (qualified names, scopes) describes the *original* tree, so rules
query it with original nodes. A rule that converts or reports an FSDP1
reference must say so (``ctx.mark_handled`` / ``ctx.report``) before the
smallest statement holding it is left, which is when the engine decides
whether that reference was left behind silently.
"""

from typing import ClassVar

from migrate_fsdp.rewrite.context import FileContext

FSDP2_MODELS = "fsdp2-models"  # FSDP(...) constructors become fully_shard
OPTIMIZER_STATE = "optimizer-state"  # FSDP1 optimizer-state calls become FSDP2 ones


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # Byte strings that make a file worth parsing for this rule even when it
    # never names torch.distributed.fsdp (e.g. `.no_sync(` on a model built
    # in another file); a tuple of them counts where all of them appear.
    tokens: ClassVar[tuple[bytes | tuple[bytes, ...], ...]] = ()
    # What the rule's own reports are about: uses of models (left FSDP1, so the models must stay FSDP1 with
    # them: analysis/program.py), rather than constructors or their settings.
    reports_model_uses: ClassVar[bool] = False
    # Its reports are heads-ups on code that converts (a checkpoint format, a norm that changes): they leave no
    # FSDP1 behind, so the summary counts them apart from what stays unconverted.
    heads_up: ClassVar[bool] = False
    # What the rule's rewrite gives other rules to count on when it is selected (FSDP2_MODELS,
    # OPTIMIZER_STATE): rules ask for a capability, never for another rule's code.
    provides: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
