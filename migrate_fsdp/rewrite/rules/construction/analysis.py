"""Facts about the file that the construction rules read: definitions, devices, meta-device builds.

Gathered from the read-only pass, so that a call can be judged with the
whole file in view (a module-level `policy = ...` may be written below the
function that uses it).
"""

import libcst as cst
from libcst.metadata import Assignment

from migrate_fsdp.rewrite.analysis.kept_parameters import keeping
from migrate_fsdp.rewrite.rules.construction.arguments import Definition, Definitions
from migrate_fsdp.rewrite.rules.construction.codegen import Names, assign, is_reevaluable
from migrate_fsdp.rewrite.rules.construction.devices import SET_DEVICE, TORCH_DEVICE
from migrate_fsdp.rewrite.syntax import chain_root, dotted, subtree_ids, walk



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
        names, statement = keeping(node, self.ctx.stack[:-1])
        if statement is not None:
            self._kept_parameters.extend((name, len(self.order) - 1, statement) for name in names)

    def parameters_kept_before(self, module, call: cst.Call) -> cst.CSTNode | None:
        """A statement before the constructor `call`, in the same scope, that keeps `module`'s parameters
        (`opt = SGD(net.parameters())`): FSDP1 with use_orig_params=True kept those Parameter objects, fully_shard
        replaces them, so what it kept would no longer train the model. Callers keeping them before they call the
        function wrapping it are the program's to find (analysis/kept_parameters.py)."""
        if not isinstance(module, cst.Name):
            return None
        # what the constructor itself is given (`ignored_states=frozen_params`) is not replaced: it stays unsharded
        given = {node.value for node, _ in walk(*call.args) if isinstance(node, cst.Name)}
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
