"""The rules, discovered rather than listed: every `Rule` subclass with a code of its own, defined in a
module of the `construction` or `training` package. Adding a rule is adding a module.

Construction rules (how a model gets wrapped) run before training-loop rules
(what the code does with the wrapped model) where both hook a node type;
within a family, in code order.
"""

import importlib
import pkgutil

from migrate_fsdp.rewrite.rule import Rule

_FAMILIES = ("construction", "training")


def _discover() -> list:
    rules = []
    for family in _FAMILIES:
        package = importlib.import_module(f"{__name__}.{family}")
        found = []
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            found += [
                value
                for value in vars(module).values()
                if isinstance(value, type)
                and issubclass(value, Rule)
                and value.__module__ == module.__name__
                and "code" in vars(value)
            ]
        rules += sorted(found, key=lambda rule: rule.code)
    return rules


RULES: list = _discover()
