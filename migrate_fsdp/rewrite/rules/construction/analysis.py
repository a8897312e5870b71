"""Facts about the file that the construction rules read: definitions, devices, meta-device builds.

Gathered from the read-only pass, so that a call can be judged with the
whole file in view (a module-level `policy = ...` may be written below the
function that uses it).
"""

import re

import libcst as cst
from libcst.metadata import Assignment

from migrate_fsdp.rewrite.analysis.models import PARAMETER_READS
from migrate_fsdp.rewrite.rules.construction.arguments import Definition, Definitions
from migrate_fsdp.rewrite.rules.construction.codegen import Names, assign, is_reevaluable
from migrate_fsdp.rewrite.rules.construction.devices import SET_DEVICE, TORCH_DEVICE
from migrate_fsdp.rewrite.syntax import chain_root, dotted, subtree_ids, walk


_REDUCERS = ("sum", "len", "print", "any", "all", "max", "min", "int", "float", "str", "repr", "format")
_KEEPERS = ("append", "extend", "add_param_group", "update", "insert")
# A function handed the module whose name says it builds an optimizer or parameter groups from it
# (`build_optimizer(net)`, `get_param_groups(model)`, `torch.optim.AdamW(...)`).
_BUILDS_OPTIMIZERS = re.compile(r"optim|group|adam|sgd", re.IGNORECASE)


class Analysis:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.order: dict[int, int] = {}  # statement id -> position in the file
        self.definitions = Definitions(ctx, self.order)
        self.names = Names(ctx)
        self.current_devices: set[str] = set()  # source of X in torch.cuda.set_device(X) and friends
        self._on_meta: set[int] = set()  # ids of names assigned inside `with torch.device("meta"):`
        self.insertable: set[int] = set()  # statements that statements may be inserted before
        self._inits: list[int] = []  # positions of statements calling init_process_group
        self.fsdp1_arguments: set[int] = set()  # ids of every node inside FSDP1 calls and their kwargs dicts
        self._kept_parameters: list[tuple[cst.Name, int, cst.CSTNode]] = []  # (module name, position, statement)
        self._calls: dict[str, list[cst.Call]] = {}  # function name -> the calls of it by that name (`f(x)`, `self.f(x)`)

    # ----- fed by the read-only pass ------------------------------------------------------

    def note_assign(self, node: cst.Assign | cst.AnnAssign) -> None:
        self.definitions.note(node)
        if self._inside_meta_device():
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                if isinstance(target, cst.Name):
                    self._on_meta.add(id(target))

    def note_statement(self, node) -> None:
        self.order[id(node)] = len(self.order)
        if self.ctx.can_insert_statements():
            self.insertable.add(id(node))

    def note_call(self, node: cst.Call) -> None:
        self.definitions.calls[id(node)] = len(self.order) - 1
        self.definitions.note_logged(node)
        self.definitions.note_update(node)
        if node.args and self.ctx.matches(node.func, *SET_DEVICE):
            self.current_devices.add(self.ctx.code(node.args[0].value))
        if self.ctx.matches(node.func, "torch.distributed.init_process_group"):
            self._inits.append(len(self.order) - 1)
        func = node.func
        called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
        if called is not None:
            self._calls.setdefault(called, []).append(node)
        if isinstance(func, cst.Attribute) and func.attr.value in PARAMETER_READS and isinstance(func.value, cst.Name):
            statement = None if self._names_only(node) else self._keeping_statement()
            if statement is not None:
                self._kept_parameters.append((func.value, len(self.order) - 1, statement))
        handed = [arg.value for arg in node.args if isinstance(arg.value, cst.Name) and not arg.star]
        if handed and _BUILDS_OPTIMIZERS.search(dotted(func).rsplit(".", 1)[-1]):  # `build_optimizer(net)`
            statement = self._keeping_statement()
            if statement is not None:
                self._kept_parameters.extend((name, len(self.order) - 1, statement) for name in handed)

    def _names_only(self, call: cst.Call) -> bool:
        """`[n for n, p in net.named_parameters() if ...]`: the names, which fully_shard keeps, not the parameters."""
        stack = self.ctx.stack
        loop = stack[-2] if len(stack) >= 2 else None
        comprehension = stack[-3] if len(stack) >= 3 else None
        if not (isinstance(loop, cst.CompFor) and loop.iter is call and isinstance(comprehension, (cst.ListComp, cst.SetComp))):
            return False
        target = loop.target
        name = target.elements[0].value if isinstance(target, cst.Tuple) and len(target.elements) == 2 else None
        return isinstance(name, cst.Name) and isinstance(comprehension.elt, cst.Name) and comprehension.elt.value == name.value

    def _keeping_statement(self) -> cst.CSTNode | None:
        """The statement around the call visited, when it keeps what the call returns (`opt = SGD(net.parameters())`,
        `groups.append({"params": [...]})`) rather than reducing it (`sum(p.numel() for p in ...)`) or looping."""
        for node in reversed(self.ctx.stack[:-1]):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in _REDUCERS:
                return None
            if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                return node
            if isinstance(node, cst.Expr):
                call = node.value
                keeps = isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in _KEEPERS
                return node if keeps else None
            if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return None
        return None

    def parameters_kept_before(self, module, call: cst.Call) -> cst.CSTNode | None:
        """A statement before the constructor `call`, in the same scope, that keeps `module`'s parameters
        (`opt = SGD(net.parameters())`): FSDP1 with use_orig_params=True kept those Parameter objects, fully_shard
        replaces them, so what it kept would no longer train the model."""
        if not isinstance(module, cst.Name):
            return None
        # what the constructor itself is given (`ignored_states=frozen_params`) is not replaced: it stays unsharded
        given = {node.value for node, _ in walk(*call.args) if isinstance(node, cst.Name)}
        kept = self._kept_before(module, call, given)
        if kept is not None:
            return kept
        for caller, handed in self._callers_handing(module):  # `model = wrap_model(model)` of `def wrap_model(m)`
            kept = self._kept_before(handed, caller, frozenset())
            if kept is not None:
                return kept
        return None

    def _kept_before(self, module: cst.Name, call: cst.Call, given) -> cst.CSTNode | None:
        at = self.definitions.calls.get(id(call))
        scope = self.ctx.scope(module)
        for name, position, statement in self._kept_parameters:
            if name.value != module.value or at is None or position >= at or self.ctx.scope(name) is not scope:
                continue
            targets = statement.targets if isinstance(statement, cst.Assign) else [statement]
            bound = {dotted(getattr(t, "target", None)) for t in targets}
            if not bound & given:
                return statement
        return None

    def _callers_handing(self, module: cst.Name) -> list[tuple[cst.Call, cst.Name]]:
        """The calls of this file handing a name to the function whose parameter `module` is: (call, name)."""
        scope = self.ctx.scope(module)
        bindings = scope[module.value] if scope is not None else set()
        params = [b.node for b in bindings if isinstance(getattr(b, "node", None), cst.Param)]
        if len(params) != 1:
            return []
        function = next(
            (n for n, _ in walk(self.ctx.module) if isinstance(n, cst.FunctionDef) and params[0] in n.params.params), None
        )
        if function is None:
            return []
        positional = list(function.params.params)
        index = positional.index(params[0]) if params[0] in positional else None
        if index is not None and positional and positional[0].name.value == "self":
            index -= 1
        found = []
        for caller in self._calls.get(function.name.value, []):
            handed = next((a.value for a in caller.args if a.keyword is not None and a.keyword.value == module.value), None)
            if handed is None and index is not None and index < len(caller.args) and not any(a.star or a.keyword for a in caller.args[: index + 1]):
                handed = caller.args[index].value
            if isinstance(handed, cst.Name):
                found.append((caller, handed))
        return found

    def read_once(self, value: cst.BaseExpression, plan, *candidates: str) -> cst.BaseExpression:
        """`value` where the converted call's statements read it more than once: itself when reading it again gives
        the same object, else a variable set to it before the call (named by the first free of `candidates`),
        as FSDP1 read it once."""
        if is_reevaluable(value):
            return value
        var = self.names.fresh(plan.site.node, *candidates)
        plan.before.append(assign(var, value))
        return cst.Name(var)

    def initialises_between(self, first, last) -> bool:
        """Whether the process group is initialised after statement `first` and up to statement `last`."""
        start, end = self.order[id(first)], self.order[id(last)]
        return any(start < position <= end for position in self._inits)

    def _inside_meta_device(self) -> bool:
        for node in self.ctx.stack:
            if isinstance(node, cst.With) and any(self._is_meta_device(item.item) for item in node.items):
                return True
        return False

    def _is_meta_device(self, node) -> bool:
        return (
            isinstance(node, cst.Call)
            and self.ctx.matches(node.func, TORCH_DEVICE)
            and len(node.args) == 1
            and isinstance(node.args[0].value, cst.SimpleString)
            and node.args[0].value.evaluated_value == "meta"
        )

    def close_fsdp1_arguments(self) -> None:
        """Values of names that only FSDP1 arguments read are FSDP1 arguments too.

        So that `bf16 = MixedPrecision(...)`, read only by `mp = bf16 if c else None`,
        read only by `FSDP(model, mixed_precision=mp)`, can be followed and go with the call.
        """
        if not self.fsdp1_arguments:  # a file without FSDP1 calls: nothing to follow
            return
        pending = [d for d in self.definitions.singles() if id(d.value) not in self.fsdp1_arguments]
        changed = True
        while changed:
            changed = False
            for definition in list(pending):
                if definition.loads and all(id(load) in self.fsdp1_arguments for load in definition.loads):
                    self.fsdp1_arguments.update(subtree_ids(definition.value))
                    pending.remove(definition)
                    changed = True

    # ----- readers for the keyword rules ------------------------------------------------------

    def follow(self, node: cst.BaseExpression, plan) -> tuple[cst.BaseExpression, Definition | None]:
        """The value a name stands for at the call (see Definitions.follow), recorded as used by `plan`.

        Only names that nothing but FSDP1 calls reads: any other use could
        change the object (MixedPrecision is a mutable dataclass) or need it.
        """
        value, definition = self.definitions.follow(node, plan.site.node)
        if definition is None or not all(id(load) in self.fsdp1_arguments for load in definition.loads):
            return node, None
        plan.definitions.append(definition)
        return value, definition

    def owned(self, node, plan) -> Definition | None:
        """The single definition of a name that only this call reads (itself, or through the values it follows:
        `table` of `strategy = table[name]`), so that it can change where it stands."""
        definition = self.definitions.of(node)
        inside = subtree_ids(plan.site.node).union(*(subtree_ids(d.value) for d in plan.definitions))
        if definition is None or not all(id(load) in inside for load in definition.loads):
            return None
        return definition

    def assigned_on_branches(self, node, plan) -> list[Definition] | None:
        """The assignments of a variable set on several branches (`mp = None` / `if c: mp = MixedPrecision(...)`).

        Only when this call is the variable's only reader, so that the
        assignments can become FSDP2 values where they stand.
        """
        definitions = self.definitions.all_of(node)
        if definitions is None or len(definitions) < 2:
            return None
        inside = subtree_ids(plan.site.node)
        if not all(id(load) in inside for definition in definitions for load in definition.loads):
            return None
        return definitions

    def shared_name(self, node) -> bool:
        """`node` names a value (assigned once or on several branches) that something other than FSDP1 calls also reads."""
        definitions = self.definitions.all_of(node) or []
        return any(id(load) not in self.fsdp1_arguments for definition in definitions for load in definition.loads)

    def unfollow(self, definition: Definition, plan) -> None:
        """The name stays in the output after all: its definition is still needed."""
        plan.definitions.remove(definition)

    def function(self, node) -> cst.FunctionDef | None:
        """The `def` a name refers to, when it is the only binding in sight."""
        assignment = function_binding(self.ctx, node)
        return None if assignment is None else assignment.node

    def function_definition(self, node) -> Definition | None:
        """`def name(...)` of a name that `function` finds, as a definition that can go with the calls that read
        it (not a decorated one: its decorator may register it)."""
        assignment = function_binding(self.ctx, node)
        if assignment is None or assignment.node.decorators:
            return None
        return Definition(assignment.node.name, assignment.node, assignment.node, assignment)

    def built_on_meta(self, node) -> bool:
        """`node` is a name some assignment under `with torch.device("meta"):` gives."""
        if not isinstance(node, cst.Name):
            return False
        scope = self.ctx.scope(node)
        return scope is not None and any(id(a.node) in self._on_meta for a in scope[node.value] if isinstance(a, Assignment))

    def fsdp1_references(self, node) -> list[cst.CSTNode]:
        """The outermost FSDP1 names and attribute chains inside `node` (original tree)."""
        ctx = self.ctx
        found = []

        class _Find(cst.CSTVisitor):
            def visit_Attribute(self, attribute) -> bool:
                return not self._check(attribute)

            def visit_Name(self, name) -> None:
                self._check(name)

            def _check(self, chain) -> bool:
                if chain_root(chain) and ctx.fsdp1_names(chain):
                    found.append(chain)
                    return True
                return False

        node.visit(_Find())
        return found

    @staticmethod
    def is_none(node) -> bool:
        return isinstance(node, cst.Name) and node.value == "None"

    @staticmethod
    def literal_bool(node) -> bool | None:
        if isinstance(node, cst.Name) and node.value in ("True", "False"):
            return node.value == "True"
        return None


def function_binding(ctx, node) -> Assignment | None:
    """The binding of the name `node` by a `def`, when it is the only binding in sight."""
    if not isinstance(node, cst.Name):
        return None
    scope = ctx.scope(node)
    assignments = scope[node.value] if scope is not None else set()
    if len(assignments) != 1:
        return None
    (assignment,) = assignments
    return assignment if isinstance(assignment, Assignment) and isinstance(assignment.node, cst.FunctionDef) else None
