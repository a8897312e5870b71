"""The registry of rules, in the order they run on a node.

Construction rules (how a model gets wrapped) run before training-loop rules
(what the code does with the wrapped model) where both hook a node type.
"""

from migrate_fsdp.rewrite.rules.construction import CONSTRUCTION_RULES
from migrate_fsdp.rewrite.rules.training import TRAINING_RULES

RULES: list = [*CONSTRUCTION_RULES, *TRAINING_RULES]
