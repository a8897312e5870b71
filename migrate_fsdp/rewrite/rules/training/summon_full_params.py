"""MF204: `FSDP.summon_full_params(model)` -> reading full parameters with `full_tensor()`.

FSDP1's context manager (fully_sharded_data_parallel.py) all-gathers every
flat parameter for the block and writes the local shard back afterwards.
FSDP2 has no such block: a parameter is a DTensor, and `p.full_tensor()`
all-gathers that one parameter (the seed tutorial's state-dict section,
/work/shared/seeds/002). The rewrite handles the read-only use it can prove
safe:

    with FSDP.summon_full_params(model):          for fsdp_module in model.modules():
        for name, p in model.named_parameters():      if isinstance(fsdp_module, FSDPModule):
            print(name, p.sum())                           fsdp_module.reshard()
                                                   for name, p in model.named_parameters():
                                                       p = p.full_tensor() if isinstance(p, DTensor) else p
                                                       print(name, p.sum())

(resharding first: after an evaluation, FSDP2 leaves the root unsharded, its
parameters the working copies, bf16 under mixed precision).

It requires every rank to run the gathering: the loop (or comprehension)
must sit directly in the `with` block, not under a condition, and its body
may not `break`/`return` (ranks would stop at different parameters, and the
collective would hang), and the parameter may only be read (attributes and
methods that return new values, `print`, f-strings, comparisons...). Anything
else (writes, `writeback`, `rank0_only=True`, `recurse=False`, `with_grads`,
other uses of the model inside) is reported with the DTensor way to do it.
`offload_to_cpu=True` adds `.cpu()`.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import SUMMON_FULL_PARAMS
from migrate_fsdp.rewrite.analysis.parameter_loops import per_item
from migrate_fsdp.rewrite.reshard import HELPER_NAME as RESHARD_HELPER
from migrate_fsdp.rewrite.reshard import reshards
from migrate_fsdp.rewrite.rules.construction.codegen import statements
from migrate_fsdp.rewrite.rules.training.base import (
    FSDP2_TOKENS,
    RemovesStatements,
    bind,
    from_template,
    literal_bool,
)
from migrate_fsdp.rewrite.syntax import dotted, walk

_PARAMS = ("module", "recurse", "writeback", "rank0_only", "offload_to_cpu", "with_grads")
_DEFAULTS = {"recurse": True, "writeback": True, "rank0_only": False, "offload_to_cpu": False, "with_grads": False}
# What may be done with a gathered parameter without changing it.
_READ_ATTRIBUTES = frozenset(
    {
        "shape", "dtype", "device", "ndim", "requires_grad", "is_leaf", "T", "mT",
        "size", "dim", "numel", "nelement", "element_size", "sum", "mean", "std", "var", "norm", "abs",
        "max", "min", "amax", "amin", "argmax", "argmin", "prod", "clone", "detach", "cpu", "cuda", "to",
        "float", "double", "half", "bfloat16", "tolist", "item", "numpy", "flatten", "view", "reshape",
        "eq", "ne", "allclose", "isclose", "equal", "isnan", "isinf", "isfinite", "any", "all", "count_nonzero",
        "contiguous", "square", "sqrt", "pow",
    }
)
_READ_FUNCTIONS = frozenset(
    {
        "builtins.print", "builtins.str", "builtins.repr", "builtins.len", "builtins.float", "builtins.int",
        "builtins.format", "torch.equal", "torch.allclose", "torch.isclose", "torch.norm", "torch.sum",
        "torch.save", "torch.linalg.vector_norm", "torch.linalg.norm", "torch.isfinite", "torch.isnan",
    }
)
# Tensor methods that only read their arguments: `ema.lerp_(p, 0.2)` changes `ema`, from `p`'s values.
_READING_METHODS = frozenset(
    {
        "add_", "sub_", "mul_", "div_", "lerp_", "copy_", "addcmul_", "addcdiv_", "maximum", "minimum",
        "add", "sub", "mul", "div", "lerp", "dot", "matmul", "mm", "allclose", "equal",
    }
)
# In-place changes each element of a parameter gets from itself and numbers alone: done on each rank's shard of
# FSDP2's DTensor, they give what FSDP1 wrote back from the full parameter (random initialisers do not: the shard
# draws other numbers).
_ELEMENTWISE_WRITES = frozenset({"zero_", "fill_", "mul_", "div_", "add_", "sub_", "clamp_", "clamp_min_", "clamp_max_"})
# What a DTensor answers as the full parameter did.
_METADATA = frozenset({"shape", "dtype", "ndim", "dim", "size", "numel", "requires_grad"})
_SIZES = frozenset({"shape", "ndim", "dim", "size", "numel", "nelement", "requires_grad"})
_ITERATORS = ("parameters", "named_parameters")
# Around a comprehension, these may keep some ranks from gathering.
_CONDITIONAL = (cst.IfExp, cst.BooleanOperation, cst.Lambda, cst.CompFor, cst.If, cst.For, cst.While, cst.Try, cst.FunctionDef)
ADVICE = (
    "FSDP2 has no `summon_full_params`: read a full parameter with `p.full_tensor()` on every rank "
    "(or `get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))`), and change "
    "parameters through their local shards (`p.to_local()`) or `set_model_state_dict`"
)


class SummonFullParams(RemovesStatements):
    code = "MF204"
    name = "summon-full-params"
    summary = "FSDP.summon_full_params read-only loops -> p.full_tensor(); other uses reported"
    tokens = (*FSDP2_TOKENS, b"summon_full_params")

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._plans: dict[int, tuple] = {}  # id(With) -> (item index, {id(loop): offload_to_cpu})
        self._writing: set[int] = set()  # ids of loops that only change parameters element by element: they stay
        self._sizing: set[int] = set()  # ids of loops that only ask sizes, which a DTensor answers whole

    def visit_With(self, node: cst.With) -> None:
        for index, item in enumerate(node.items):
            if self._is_summon(item.item) and self.fsdp2_ahead(item.item):
                problem, loops = self._plan(node, item)
                if problem is None:
                    self._plans[id(node)] = (index, loops)
                    self.ctx.mark_handled(item.item)
                else:
                    self.ctx.report(item.item, self.code, f"not converted: {problem}; {ADVICE}")

    def leave_Call(self, original: cst.Call, updated):
        if self._is_summon(original) and not self._in_with_item(original):
            self.ctx.report(original, self.code, f"used outside a `with` statement; {ADVICE}")
        return updated

    def _is_summon(self, node) -> bool:
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return False
        # Only FSDP1 has it: `FSDP.summon_full_params(m)` or, as a static method, `m.summon_full_params(m)`.
        if node.func.attr.value != "summon_full_params" or self.ctx.matches(node.func.value, "torch.distributed.fsdp.FSDPModule"):
            return False
        # fairscale's FSDP has one too: only a program using torch's FSDP1 is asked about it.
        return self.ctx.matches(node.func, SUMMON_FULL_PARAMS) or self.ctx.program.may_build_fsdp1()

    def _in_with_item(self, call) -> bool:
        stack = self.ctx.stack
        return len(stack) >= 3 and isinstance(stack[-2], cst.WithItem) and stack[-2].item is call

    def _plan(self, with_node: cst.With, item: cst.WithItem):
        call = item.item
        bound = bind(call, _PARAMS)
        if bound is None or "module" not in bound:
            return "arguments not understood", None
        options = dict(_DEFAULTS)
        for name in _DEFAULTS:
            if name in bound:
                options[name] = literal_bool(bound[name].value)
                if options[name] is None:
                    return f"`{name}` is not True/False", None
        unsupported = [f"`{name}={not _DEFAULTS[name]}`" for name in ("recurse", "rank0_only", "with_grads") if options[name] != _DEFAULTS[name]]
        if unsupported:
            return f"{', '.join(unsupported)} has no full_tensor() equivalent", None
        if item.asname is not None:
            return "the context value is used", None
        model = dotted(bound["module"].value)
        if not model or isinstance(with_node.body, cst.SimpleStatementSuite):
            return "the block is not a plain loop over the model's parameters", None
        loops, used = {}, False
        for statement in with_node.body.body:
            for node, parents in walk(statement):
                if dotted(node) != model or not isinstance(node, (cst.Name, cst.Attribute)):
                    continue
                problem = self._check_use(statement, node, parents, options["writeback"])
                if problem is not None:
                    return problem, None
                used = True
                if id(parents[-3]) not in self._writing | self._sizing:
                    loops[id(parents[-3])] = options["offload_to_cpu"]
        if not used:
            return "the block does not read the model's parameters", None
        return None, loops

    def _check_use(self, statement, node, parents, writeback: bool) -> str | None:
        """A use of the model in the block: only `for ... in model.(named_)parameters()` loops that read the
        parameters, or (with writeback) change them element by element, pass."""
        attribute = parents[-1] if parents else None
        call = parents[-2] if len(parents) >= 2 else None
        loop = parents[-3] if len(parents) >= 3 else None
        if not (
            isinstance(attribute, cst.Attribute)
            and attribute.attr.value in _ITERATORS
            and isinstance(call, cst.Call)
            and not call.args
        ):
            return "the block uses the model other than in a loop over its parameters"
        named = attribute.attr.value == "named_parameters"
        if isinstance(loop, cst.For) and loop.iter is call and _at_top(loop, statement, self.ctx):
            target = _parameter_target(loop.target, named)
            if target is None or isinstance(loop.body, cst.SimpleStatementSuite):
                return "the loop target is not `p` / `name, p`"
            problem = self._check_reads(loop.body, target, allow_exit=False)
            if problem is None:
                self._note_sizing(loop, [loop.body], target)
                return None
            if not self._writes_in_place(loop.body, target):
                change = self._other_change(loop.body, target) if writeback else None
                return problem if change is None else (
                    f"`{change}` changes a full parameter as no shard can on its own (a random draw, a tensor "
                    "argument): initialise before fully_shard, or load with set_model_state_dict"
                )
            if not writeback:
                return f"`{target}` is changed where FSDP1 threw the changes away (writeback=False)"
            self._writing.add(id(loop))  # no gathering: each rank changes its shard, the summon goes
            return None
        if isinstance(loop, cst.CompFor) and loop.iter is call:
            comprehension = parents[-4]
            target = _parameter_target(loop.target, named)
            conditional = any(isinstance(p, _CONDITIONAL) for p in parents[:-3])
            if target is None or conditional or loop.inner_for_in is not None:
                return "the comprehension is not a plain one over the parameters"
            problem = self._check_reads(comprehension, target, allow_exit=True)
            if problem is None:
                self._note_sizing(loop, per_item(comprehension, loop), target)
            return problem
        return "the parameters are not iterated by a loop at the top of the block (every rank must gather them)"

    def _note_sizing(self, loop, scopes: list, target: str) -> None:
        """`loop` only asks `target` its size (`p.numel()`, `p.shape`): a DTensor answers as the full parameter did,
        and so does an unsharded one, so nothing is gathered or resharded for it (a dtype is another matter: an
        unsharded parameter is the working copy, in param_dtype under mixed precision)."""
        for node, parents in walk(*scopes):
            if isinstance(node, cst.Name) and node.value == target:
                parent = parents[-1] if parents else None
                if not (isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in _SIZES):
                    return
        self._sizing.add(id(loop))

    def _check_reads(self, scope_node, target: str, allow_exit: bool) -> str | None:
        for node, parents in walk(scope_node):
            if isinstance(node, (cst.Break, cst.Return, cst.Raise)) and not allow_exit:
                return "the loop can stop early on some ranks (`break`/`return`/`raise`)"
            if isinstance(node, cst.Name) and node.value == target and not self._is_read(node, parents):
                return f"`{target}` may be changed or kept (writes are not written back by FSDP2)"
        return None

    def _writes_in_place(self, body, target: str) -> bool:
        """`target` is only changed element by element with numbers (`p.zero_()`, `p.mul_(0.5)`) and otherwise
        only asked what a DTensor answers as the full parameter did (`p.ndim`, `p.shape`)."""
        writes = 0
        for node, parents in walk(body):
            if not (isinstance(node, cst.Name) and node.value == target):
                continue
            parent = parents[-1] if parents else None
            if not (isinstance(parent, cst.Attribute) and parent.value is node):
                return False  # its values read (a shard's, here): `print(p)`, `p > 0`, `torch.isnan(p)`
            if parent.attr.value in _METADATA:
                continue
            if not _elementwise_chain(parents[:-1], parent):
                return False
            writes += 1
        return writes > 0

    def _other_change(self, body, target: str) -> str | None:
        """The first in-place call on `target` (`p.normal_(0, 0.02)`) that is not an element-wise change with
        numbers, as written."""
        for node, parents in walk(body):
            if not (isinstance(node, cst.Name) and node.value == target and parents):
                continue
            attribute = parents[-1]
            call = parents[-2] if len(parents) >= 2 else None
            if isinstance(attribute, cst.Attribute) and attribute.value is node and isinstance(call, cst.Call) and call.func is attribute:
                if attribute.attr.value.endswith("_") and not _elementwise_chain(parents[:-1], attribute):
                    return self.ctx.code(call)
        return None

    @staticmethod
    def _first_statement(body: list):
        """The first statement `body` runs, looking into a leading `with torch.no_grad():`."""
        first = body[0] if body else None
        while isinstance(first, cst.With) and isinstance(first.body, cst.IndentedBlock) and first.body.body:
            first = first.body.body[0]
        return first

    def _is_read(self, node, parents) -> bool:
        parent = parents[-1] if parents else None
        if isinstance(parent, (cst.CompFor, cst.For)) and parent.target is node:
            return True
        if isinstance(parent, cst.Tuple) and len(parents) >= 2 and isinstance(parents[-2], (cst.CompFor, cst.For)):
            return True
        if isinstance(parent, cst.Element) and len(parents) >= 3 and isinstance(parents[-3], (cst.CompFor, cst.For)):
            return True
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return parent.attr.value in _READ_ATTRIBUTES
        if isinstance(parent, cst.Arg) and len(parents) >= 2 and isinstance(parents[-2], cst.Call):
            func = parents[-2].func
            if isinstance(func, cst.Attribute) and func.attr.value in _READING_METHODS and parent.keyword is None:
                # another tensor's method taking the parameter's values (not one of the parameter itself)
                return not any(isinstance(n, cst.Name) and n.value == node.value for n, _ in walk(func.value))
            return self.ctx.matches(func, *_READ_FUNCTIONS)
        return isinstance(
            parent, (cst.FormattedStringExpression, cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation, cst.UnaryOperation)
        )

    def leave_For(self, original: cst.For, updated: cst.For):
        updated = self.attach_pending(original, updated)
        offload = self._offload(original)
        if offload is None:
            return updated
        target = _parameter_target(original.target, original.iter.func.attr.value == "named_parameters")
        gather = cst.parse_statement(f"{target} = {self._full(target, offload)}")
        body = updated.body
        return updated.with_changes(body=body.with_changes(body=[gather, *body.body]))

    def leave_CompFor(self, original: cst.CompFor, updated: cst.CompFor):
        offload = self._offload(original)
        if offload is None:
            return updated
        named = original.iter.func.attr.value == "named_parameters"
        full = self._full("param", offload)
        template = f"((name, {full}) for name, param in ITER)" if named else f"({full} for param in ITER)"
        return updated.with_changes(iter=from_template(template, ITER=updated.iter))

    def _full(self, target: str, offload: bool) -> str:
        """The full parameter: a DTensor gathered; one FSDP2 does not manage (the block reshards the rest first)
        is a plain tensor, whole already."""
        dtensor = self.ctx.require_import("torch.distributed.tensor", "DTensor")
        cpu = ".cpu()" if offload else ""
        return f"{target}.full_tensor(){cpu} if isinstance({target}, {dtensor}) else {target}{cpu}"

    def _offload(self, loop) -> bool | None:
        """Whether FSDP1 offloaded the parameters `loop` reads to CPU; None when the loop is not converted."""
        for plan in self._plans.values():
            if id(loop) in plan[1]:
                return plan[1][id(loop)]
        return None

    def leave_With(self, original: cst.With, updated):
        updated = self.attach_pending(original, updated)
        plan = self._plans.pop(id(original), None)
        if plan is None:
            return updated
        call = updated.items[plan[0]].item
        model = next(arg.value for arg in call.args if arg.keyword is None or arg.keyword.value == "module")
        first = self._first_statement(updated.body.body)
        if not plan[1] and not self._writing_in(original):
            resharded = []  # only sizes asked: the same from sharded and unsharded parameters
        elif first is not None and reshards(self.ctx, first) == self.ctx.code(model):
            resharded = []  # resharded there already (an in-place change under no_grad is, wherever it stands)
        else:
            resharded = self._resharded(original, model)
        body = updated.body.with_changes(body=[*resharded, *updated.body.body])
        return self.unwrap_with(updated.with_changes(body=body), plan[0])

    def _writing_in(self, original: cst.With) -> bool:
        return any(id(node) in self._writing for node, _ in walk(original.body))

    def _resharded(self, original: cst.With, model) -> list[cst.BaseStatement]:
        """FSDP2 leaves a module unsharded after a forward no backward followed (an evaluation under no_grad): its
        parameters are then the working copies, in param_dtype under mixed precision. Resharding first gives every
        parameter back as the full-precision DTensor FSDP1 gathered."""
        helper = self.ctx.add_helper(RESHARD_HELPER)
        return statements(f"{helper}(MODEL)", MODEL=model)


def _at_top(loop: cst.For, statement, ctx) -> bool:
    """The loop is a statement of the block, or of a `with torch.no_grad():` that is one: every rank runs it."""
    if loop is statement:
        return True
    return (
        isinstance(statement, cst.With)
        and all(isinstance(i.item, cst.Call) and ctx.matches(i.item.func, "torch.no_grad") for i in statement.items)
        and isinstance(statement.body, cst.IndentedBlock)
        and any(child is loop for child in statement.body.body)
    )


def _elementwise_chain(parents, attribute: cst.Attribute) -> bool:
    """`p.mul_(0.5)` / `p.mul_(0.5).clamp_(-1, 1)` as a statement of its own: element-wise changes with numbers
    only, whose value goes nowhere."""
    while True:
        call = parents[-1] if parents else None
        if not (attribute.attr.value in _ELEMENTWISE_WRITES and isinstance(call, cst.Call) and call.func is attribute):
            return False
        if not all(_is_number(arg.value) and arg.star == "" for arg in call.args):
            return False
        outer = parents[-2] if len(parents) >= 2 else None
        if isinstance(outer, cst.Expr):
            return True
        if not (isinstance(outer, cst.Attribute) and outer.value is call):
            return False
        attribute, parents = outer, parents[:-2]


def _is_number(node) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


def _parameter_target(target, named: bool) -> str | None:
    """`p` of `for p in model.parameters()` / `for name, p in model.named_parameters()`."""
    if not named:
        return target.value if isinstance(target, cst.Name) else None
    if isinstance(target, cst.Tuple) and len(target.elements) == 2 and isinstance(target.elements[1].value, cst.Name):
        return target.elements[1].value.value
    return None

