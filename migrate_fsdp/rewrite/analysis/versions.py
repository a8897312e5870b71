"""Code that already serves FSDP1 and FSDP2 side by side, which the rewrite must leave working.

A project that supports both versions dispatches on them: an `if` whose test
names FSDP2 (`isinstance(m, FSDPModule)`), or a torch version while some
branch holds FSDP1 code and another does not (every branch FSDP1's picks
between two torch versions' FSDP1 calls: plain FSDP1 code), an if/elif chain with an FSDP1 branch and an FSDP2
one (`if strategy == "fsdp": FSDP(...)` / `elif strategy == "fsdp2":
fully_shard(...)`), a tuple naming both classes, a function kept for
FSDP1 beside its FSDP2 twin (`save_fsdp1` next to `save_fsdp2`). Rewriting
the FSDP1 side there turns both branches into FSDP2 code and breaks the
FSDP1 one (or makes it dead), so such a region is left as it is and
reported once.
"""

import re

import libcst as cst

from migrate_fsdp.rewrite.names import is_fsdp1, is_fsdp2
from migrate_fsdp.rewrite.syntax import children, walk

# How a torch version test usually reads: `Version(torch.__version__) >= ...`, `TORCH_GE_2_4`,
# `is_torch_greater_or_equal(...)`.
_VERSION_TEST = re.compile(
    r"torch.{0,40}version|version.{0,40}torch|torch_(?:version|ge|lt|greater|less)|is_torch_(?:greater|less|version)",
    re.IGNORECASE,
)
_FSDP2_SPELLED = re.compile(r"FSDPModule|fully_shard|MixedPrecisionPolicy|OffloadPolicy|register_fsdp_forward_method")
_FSDP2_WORD = re.compile(r"fully_shard|FSDPModule|MixedPrecisionPolicy|CPUOffloadPolicy|OffloadPolicy")
_FSDP1_NAMED = re.compile(r"fsdp_?1", re.IGNORECASE)
_FSDP_VERSION_SETTING = re.compile(r"fsdp_?version|fsdp_?[12]\b", re.IGNORECASE)
_FSDP2_NAMED = re.compile(r"fsdp_?2", re.IGNORECASE)
_FSDP2_TWIN = re.compile(r"def\s+\w*fsdp_?2", re.IGNORECASE)  # a cheap test before looking for the defs
_TESTS_FSDP2 = "tests for FSDP2"
_TESTS_SETTING = "tests which FSDP version to use"
_BY_VERSION = (_TESTS_FSDP2, _TESTS_SETTING)
# Methods of an FSDP1 model FSDP2's has not: under a test of the FSDP version, the model's FSDP1 side
# (`if cfg.fsdp_version == 2: model.set_requires_gradient_sync(last) else: ctx = model.no_sync()`).
_FSDP1_METHODS = ("no_sync", "clip_grad_norm_")
# ... and an FSDP2 model's, which code serving both asks for by name
_FSDP2_METHODS = ("unshard", "reshard", "set_requires_gradient_sync", "set_reshard_after_backward")


class DualVersionRegions:
    """The statements, by id, that dispatch between FSDP1 and FSDP2; found on first use."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._regions: dict[int, str] | None = None
        self._named: dict[int, tuple[bool, bool, bool]] = {}  # by node id: what `_versions` and FSDP2 words find

    def why(self, node) -> str | None:
        """What makes `node` such a region, when it is one."""
        if self._regions is None:
            self._regions = self._find()
            self._named = {}  # only the search reads it: a program's files keep their contexts alive
        return self._regions.get(id(node))

    def holds(self, stack) -> bool:
        """Some node of `stack` (original nodes, outermost first) is such a region."""
        return any(self.why(node) is not None for node in stack)

    def _versions(self, node) -> tuple[bool, bool]:
        """(names FSDP1, names FSDP2) anywhere under `node`."""
        one, two, _ = self._names(node)
        return one, two

    def _branch_versions(self, body) -> tuple[bool, bool]:
        """`_versions`, where FSDP2 may also be spelt through a project's own re-export or wrapper
        (`from myproject.utils import fully_shard`, `apply_fsdp2(model)`)."""
        one, two, word = self._names(body)
        return one, two or word

    def _names(self, node) -> tuple[bool, bool, bool]:
        """(names FSDP1, names FSDP2, has a word that says FSDP2) anywhere under `node`: read off the tree
        bottom up, each node once (the branches of nested `if`s are asked about again and again)."""
        found = self._named.get(id(node))
        if found is None:
            self._read_names(node)
            found = self._named.pop(id(node))  # `node` may be a block made for the question (`_rest`): not kept
        return found

    def _read_names(self, root) -> None:
        named = self._named
        pending = [(root, None, None)]
        while pending:
            node, parent, below = pending.pop()
            if below is None:
                below = children(node)
                pending.append((node, parent, below))
                pending.extend((child, node, None) for child in below if id(child) not in named)
                continue
            one = two = word = False
            if isinstance(node, (cst.Name, cst.Attribute)) and not isinstance(parent, cst.Attribute):
                names = self.ctx.qualified_names(node)
                one = any(is_fsdp1(n) for n in names)
                two = any(is_fsdp2(n) for n in names)
            if isinstance(node, cst.Name):
                word = bool(_FSDP2_WORD.fullmatch(node.value) or _FSDP2_NAMED.search(node.value))
            elif isinstance(node, cst.SimpleString):
                word = node.value[1:-1] in _FSDP2_METHODS  # `hasattr(model, "unshard")`
            for child in below:
                child_one, child_two, child_word = named[id(child)]
                one, two, word = one or child_one, two or child_two, word or child_word
            named[id(node)] = (one, two, word)

    def _find(self) -> dict[int, str]:
        regions: dict[int, str] = {}
        module = self.ctx.module
        text = self.ctx.text
        if not (_FSDP2_SPELLED.search(text) or _VERSION_TEST.search(text) or _FSDP_VERSION_SETTING.search(text)):
            return regions  # nothing to dispatch between
        twins = {
            statement.name.value
            for statement, _ in (walk(module) if _FSDP2_TWIN.search(text) else ())
            if isinstance(statement, cst.FunctionDef) and _FSDP2_NAMED.search(statement.name.value)
        }
        for node, parents in walk(module):
            if isinstance(node, cst.If) and not isinstance(parents[-1] if parents else None, cst.If):
                function = next((p for p in reversed(parents) if isinstance(p, cst.FunctionDef)), None)
                leaves = function is not None and node.orelse is None and self._serves_fsdp2_and_leaves(node)
                # `if fsdp2: ...; return` - the rest of the function is the other branch
                why = self._dispatching_if(node, _rest(node, parents[-1] if parents else None) if leaves else None)
                if why is not None and leaves:
                    node = function
            elif isinstance(node, cst.Tuple) and all(self._versions(node)):
                why = "names the FSDP1 and the FSDP2 class together"
                node = next(p for p in reversed(parents) if isinstance(p, (cst.SimpleStatementLine, cst.BaseCompoundStatement)))
            elif isinstance(node, cst.BooleanOperation) and all(self._branch_versions(node)):
                # `isinstance(m, FSDP) or hasattr(m, "unshard")`
                why = "asks for the FSDP1 and the FSDP2 model together"
                node = next(p for p in reversed(parents) if isinstance(p, (cst.SimpleStatementLine, cst.BaseCompoundStatement)))
            elif isinstance(node, cst.FunctionDef) and twins and _FSDP1_NAMED.search(node.name.value):
                why = f"serves FSDP1 beside an FSDP2 twin ({sorted(twins)[0]})"
            else:
                continue
            if why is not None and (self._versions(node)[0] or why in _BY_VERSION and _calls_fsdp1_methods(node)):
                regions.setdefault(id(node), why)
        return regions

    def _serves_fsdp2_and_leaves(self, node: cst.If) -> bool:
        """`if <FSDP2 or version test>: <code without FSDP1>; return`: the rest of the function is the FSDP1
        branch. A guard (`if torch < 2.2: raise ...`) serves neither version, and an early return into FSDP1
        code serves an old FSDP1: in both the rest of the function is just FSDP1 code."""
        one, two = self._versions(node.body)
        return _exits(node.body) and not _raises(node.body) and (self._versions(node.test)[1] or two or not one)

    def _dispatching_if(self, node: cst.If, rest: cst.IndentedBlock | None = None) -> str | None:
        """An if/elif chain with a test on FSDP2 or the torch version and FSDP1 code in it. `rest`: the
        statements after an `if` that leaves the function, its other branch."""
        tests, bodies = [], []
        clause = node
        while isinstance(clause, cst.If):
            tests.append(clause.test)
            bodies.append(clause.body)
            clause = clause.orelse
        if clause is not None:
            bodies.append(clause.body)
        if rest is not None:
            bodies.append(rest)
        if any(self._versions(test)[1] for test in tests):
            return _TESTS_FSDP2
        versions = [self._branch_versions(body) for body in bodies]
        if any(_VERSION_TEST.search(self.ctx.code(test)) for test in tests):
            # Every branch FSDP1's (`optim_state_dict_to_load`'s argument order before torch 2.1 and after): FSDP1
            # code for two torch versions, which converts as any FSDP1 code does.
            return None if all(one and not two for one, two in versions) else "tests the torch version"
        if any(_FSDP_VERSION_SETTING.search(self.ctx.code(test)) for test in tests):
            return _TESTS_SETTING  # `if cfg.fsdp_version == 2:`, `if args.use_fsdp2:`
        if any(one and not two for one, two in versions) and any(two and not one for one, two in versions):
            return "picks FSDP1 or FSDP2 by a setting"  # `if strategy == "fsdp": FSDP(...) elif ... "fsdp2": fully_shard(...)`
        return None


def _rest(node: cst.If, block) -> cst.IndentedBlock | None:
    """The statements after `node` in its block, as a block."""
    if not isinstance(block, cst.IndentedBlock):
        return None
    index = next(i for i, statement in enumerate(block.body) if statement is node)
    return block.with_changes(body=block.body[index + 1 :])


def _last_small_statement(body):
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    last = statements[-1] if statements else None
    return last.body[-1] if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else None


def _exits(body) -> bool:
    """The block always leaves its function or loop."""
    return isinstance(_last_small_statement(body), (cst.Return, cst.Raise, cst.Continue, cst.Break))


def _raises(body) -> bool:
    return isinstance(_last_small_statement(body), cst.Raise)


def _calls_fsdp1_methods(node) -> bool:
    """`node` calls a method only an FSDP1 model has (`model.no_sync()`), not torch.nn.utils' function."""
    for child, parents in walk(node):
        if isinstance(child, cst.Call) and isinstance(child.func, cst.Attribute) and child.func.attr.value in _FSDP1_METHODS:
            if not cst.Module([]).code_for_node(child.func.value).endswith("utils"):
                return True
    return False
