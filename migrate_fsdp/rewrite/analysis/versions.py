"""Code that already serves FSDP1 and FSDP2 side by side, which the rewrite must leave working.

A project that supports both versions dispatches on them: an `if` whose test
names FSDP2 (`isinstance(m, FSDPModule)`) or a torch version while its
branches hold FSDP1 code, a tuple naming both classes, a function kept for
FSDP1 beside its FSDP2 twin (`save_fsdp1` next to `save_fsdp2`). Rewriting
the FSDP1 side there turns both branches into FSDP2 code and breaks the
FSDP1 one (or makes it dead), so such a region is left as it is and
reported once.
"""

import re

import libcst as cst

from migrate_fsdp.rewrite.names import is_fsdp1, is_fsdp2
from migrate_fsdp.rewrite.syntax import walk

# How a torch version test usually reads: `Version(torch.__version__) >= ...`, `TORCH_GE_2_4`,
# `is_torch_greater_or_equal(...)`.
_VERSION_TEST = re.compile(
    r"torch.{0,40}version|version.{0,40}torch|torch_(?:version|ge|lt|greater|less)|is_torch_(?:greater|less|version)",
    re.IGNORECASE,
)
_FSDP2_SPELLED = re.compile(r"FSDPModule|fully_shard|MixedPrecisionPolicy|OffloadPolicy|register_fsdp_forward_method")
_FSDP1_NAMED = re.compile(r"fsdp_?1", re.IGNORECASE)
_FSDP2_NAMED = re.compile(r"fsdp_?2", re.IGNORECASE)


class DualVersionRegions:
    """The statements, by id, that dispatch between FSDP1 and FSDP2; found on first use."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._regions: dict[int, str] | None = None

    def why(self, node) -> str | None:
        """What makes `node` such a region, when it is one."""
        if self._regions is None:
            self._regions = self._find()
        return self._regions.get(id(node))

    def holds(self, stack) -> bool:
        """Some node of `stack` (original nodes, outermost first) is such a region."""
        return any(self.why(node) is not None for node in stack)

    def _versions(self, node) -> tuple[bool, bool]:
        """(names FSDP1, names FSDP2) anywhere under `node`."""
        one = two = False
        for child, parents in walk(node):
            if isinstance(child, (cst.Name, cst.Attribute)) and not isinstance(parents[-1] if parents else None, cst.Attribute):
                names = self.ctx.qualified_names(child)
                one = one or any(is_fsdp1(n) for n in names)
                two = two or any(is_fsdp2(n) for n in names)
        return one, two

    def _find(self) -> dict[int, str]:
        regions: dict[int, str] = {}
        module = self.ctx.module
        if not (_FSDP2_SPELLED.search(self.ctx.text) or _VERSION_TEST.search(self.ctx.text)):
            return regions  # nothing to dispatch between
        twins = {
            statement.name.value
            for statement, _ in walk(module)
            if isinstance(statement, cst.FunctionDef) and _FSDP2_NAMED.search(statement.name.value)
        }
        for node, parents in walk(module):
            if isinstance(node, cst.If) and not isinstance(parents[-1] if parents else None, cst.If):
                why = self._dispatching_if(node)
                function = next((p for p in reversed(parents) if isinstance(p, cst.FunctionDef)), None)
                if why is not None and function is not None and _exits(node.body) and node.orelse is None:
                    node = function  # `if fsdp2: ...; return` - the rest of the function is the other branch
            elif isinstance(node, cst.Tuple) and all(self._versions(node)):
                why = "names the FSDP1 and the FSDP2 class together"
                node = next(p for p in reversed(parents) if isinstance(p, (cst.SimpleStatementLine, cst.BaseCompoundStatement)))
            elif isinstance(node, cst.FunctionDef) and twins and _FSDP1_NAMED.search(node.name.value):
                why = f"serves FSDP1 beside an FSDP2 twin ({sorted(twins)[0]})"
            else:
                continue
            if why is not None and self._versions(node)[0]:
                regions.setdefault(id(node), why)
        return regions

    def _dispatching_if(self, node: cst.If) -> str | None:
        """An if/elif chain with a test on FSDP2 or the torch version and FSDP1 code in it."""
        tests = []
        clause = node
        while isinstance(clause, cst.If):
            tests.append(clause.test)
            clause = clause.orelse
        if any(self._versions(test)[1] for test in tests):
            return "tests for FSDP2"
        if any(_VERSION_TEST.search(self.ctx.code(test)) for test in tests):
            return "tests the torch version"
        return None


def _exits(body) -> bool:
    """The block always leaves its function or loop."""
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    last = statements[-1] if statements else None
    small = last.body[-1] if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else None
    return isinstance(small, (cst.Return, cst.Raise, cst.Continue, cst.Break))
