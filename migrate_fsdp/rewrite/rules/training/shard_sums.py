"""MF216: an FSDP model's parameters or gradients summed and all-reduced by hand: FSDP1 gave each rank its shard.

Outside forward, FSDP1 showed `p` and `p.grad` of `model.parameters()` as this
rank's shard (of a flat parameter, or a view of one), so the usual logging and
clipping code summed their squares and `dist.all_reduce`d the sum to get the
global norm. FSDP2's are DTensors: adding one to a plain tensor fails,
all_reduce takes none, and a sum over DTensors is already global, so the
all-reduce would count it once per rank.

Where every value read is a sum over the tensor's elements (`.pow(2).sum()`,
`.norm() ** 2`, `torch.sum(x ** 2)`, `.abs().sum()`), the shards' sums add up
to the same total however the elements are split over the ranks, so FSDP2's
local shard (`p.grad.to_local()`) gives the all-reduce what FSDP1's gave it;
so too where the function only sums and its caller all-reduces. A model handed
in from callers the program cannot all trace (or held on an object, or only its
parameters handed in) takes a helper that does that for a DTensor and leaves
any other tensor as it is. In a function that all-reduces, any other read (a
sum of per-shard norms, a maximum, an in-place change) depends on how FSDP1 cut
its flat parameters: reported at the loop, and the model stays FSDP1.
"""

import libcst as cst

from migrate_fsdp.rewrite.reshard import reshard_before
from migrate_fsdp.rewrite.analysis.guards import in_summon
from migrate_fsdp.rewrite.analysis.models import Kind
from migrate_fsdp.rewrite.analysis.parameter_loops import (
    copies_parameters,
    handed_in,
    loop_target,
    optimizer_groups,
    parameters_source,
    per_item,
)
from migrate_fsdp.rewrite.rules.training.base import TrainingRule, code_of
from migrate_fsdp.rewrite.syntax import dotted, walk

HELPER = "fsdp2_local"
_ALL_REDUCE = ("torch.distributed.all_reduce", "torch.distributed.distributed_c10d.all_reduce")
# What a parameter answers the same from a shard or a DTensor, or that reads no value.
_NOT_VALUES = frozenset(
    {"shape", "ndim", "dim", "size", "numel", "nelement", "dtype", "device", "requires_grad", "is_leaf", "name"}
)
_TENSOR_OF = ("grad", "data")  # `p.grad`, `p.data`, `p.grad.data`: the tensor whose shard is read
# Methods giving a tensor of the same elements, each changed on its own: a sum of them still adds up over shards.
_ELEMENTWISE = frozenset({"float", "double", "half", "bfloat16", "to", "detach", "abs", "square", "pow", "clone"})
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
# Functions taking the tensor first, as spelled: a sum over all elements, or a norm.
_FUNCTIONS = {"torch.sum": "sum", "torch.norm": "norm", "torch.linalg.norm": "norm", "torch.linalg.vector_norm": "norm"}


class ShardSums(TrainingRule):
    code = "MF216"
    name = "shard-sums"
    summary = "sums of an FSDP model's parameters or gradients all-reduced by hand: FSDP1's were shards -> to_local()"
    # Gradient-norm helpers live in modules that may name no FSDP (a metrics module).
    tokens = ((b"parameters(", b"all_reduce"), (b"parameters(", b".grad", b"norm"), (b"parameters(", b".grad", b".sum("))

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reducing: dict[int, bool] = {}  # id(function or module) -> it calls all_reduce
        self._loops: dict[int, _Local] = {}  # id(loop) -> how its reads take their shard, for the loops converted

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        self._iterable(original)
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        self._iterable(original)  # `for p in params:` of `params = list(model.parameters())`
        return updated

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        self._iterable(original)  # `for p in group["params"]:` of an optimizer's groups
        return updated

    def _iterable(self, original) -> None:
        """Decided at the loop's iterable, which runs once before the loop: a reshard goes before the statement."""
        stack = self.ctx.stack
        loop = stack[-2] if len(stack) >= 2 else None
        if isinstance(loop, (cst.For, cst.CompFor)) and loop.iter is original:
            comprehension = None
            if isinstance(loop, cst.CompFor):
                comprehension = next((n for n in reversed(stack[:-2]) if isinstance(n, _COMPREHENSIONS)), None)
            scopes = per_item(comprehension, loop) if comprehension is not None else [loop.body]
            local = self._local(loop, scopes)
            if local is not None:
                self._loops[id(comprehension if comprehension is not None else loop)] = local

    def leave_For(self, original: cst.For, updated: cst.For):
        local = self._loops.get(id(original))
        return updated if local is None else updated.with_changes(body=_LocalShards(local).visit_parts(updated.body))

    def leave_ListComp(self, original, updated):
        return self._comprehension(original, updated)

    def leave_SetComp(self, original, updated):
        return self._comprehension(original, updated)

    def leave_GeneratorExp(self, original, updated):
        return self._comprehension(original, updated)

    def leave_DictComp(self, original, updated):
        return self._comprehension(original, updated)

    def _comprehension(self, original, updated):
        local = self._loops.get(id(original))
        return updated if local is None else _LocalShards(local).visit_parts(updated)

    def _local(self, loop, scopes: list):
        """How this loop's value reads of a converting model's parameters take the local shard: `.to_local()`, the
        helper's name, or None (nothing to change, or reported)."""
        if in_summon(self.ctx, self.ctx.stack):
            return None  # full parameters there (MF204)
        target = loop_target(loop)
        reads = _value_reads(scopes, target) if target is not None else []
        model = parameters_source(self.ctx, loop.iter)
        if model is None and _handed_parameters(self.ctx, loop.iter, reads):
            model = loop.iter  # `for p in params:` of `def grad_norm(params)`, handed `model.parameters()`
        groups = optimizer_groups(self.ctx, loop.iter) if model is None else None
        model = model if groups is None else groups
        if model is None or not reads:
            return None
        known = groups is None and self.models.is_fsdp_model(model)
        copies = copies_parameters(self.ctx, model)  # an EMA's shadow: copies of the shards, never resharded
        unknown = groups is not None or self.models.kind(model) is Kind.UNKNOWN or copies
        if not known and not (unknown and self.ctx.program.may_build_fsdp1()):
            return None  # a module shown not to be an FSDP1 model (built here, a DDP model)
        # A forward (an evaluation) may leave FSDP2's root unsharded, its parameters plain tensors, where FSDP1's
        # were shards again: a read of parameters (not gradients) reshards first. An optimizer holds the sharded ones.
        unsharded = not copies and groups is None and any(_is_parameter(tensor) for tensor, _ in reads)
        blocking = next((_chain(tensor, parents) for tensor, parents in reads if not _summed(tensor, parents)), None)
        if blocking is None and (self.ctx.can_insert_statements() or not unsharded):
            if known and not self.fsdp2_ahead(model):
                return None  # reported there
            if not known and self.ctx.dual_versions.holds(self.ctx.stack):
                return None  # code serving both versions is the user's
            local = _Local(target) if known else self._any_model(model, target)
            if local is not None and unsharded:
                reshard_before(self.ctx, model)
            return local
        if not self._all_reduces():  # a sum converts all the same: a caller may all-reduce it, FSDP1's was this rank's
            return None  # no sum over shards in sight: whatever it reads, it reads as before
        why = (
            f"`{code_of(self.ctx, blocking)}` is no sum over the elements, which FSDP1's flat shards and FSDP2's "
            "local shards split otherwise"
            if blocking is not None
            else "the parameters need a reshard first, and the loop is where no statement can go before it"
        )
        self.ctx.report(
            model,
            self.code,
            f"`{self.ctx.code(model)}`'s parameters read here and all-reduced by hand: {why}; kept FSDP1",
            fsdp1_only=not known,  # a model handed in (or held): the ones that may reach it stay with it
            any_model=groups is not None,  # an optimizer's: the models of the files it runs with
        )
        return None

    def _any_model(self, model, target: str) -> "_Local | None":
        """How the reads of a model handed in take their shard: as those of a known model where every model reaching
        them converts, else through the helper (it serves any tensor); None where no converting model reaches them."""
        program = self.ctx.program
        program.use(model, self.code, tuple(self.ctx.stack), dispatchable=True)
        if program.traced(model):
            return _Local(target)
        return _Local(target, self.ctx.add_helper(HELPER)) if program.dispatch(model) else None

    def _all_reduces(self) -> bool:
        """The function around (or the module) calls `dist.all_reduce`."""
        around = next((n for n in reversed(self.ctx.stack) if isinstance(n, (cst.FunctionDef, cst.Module))), None)
        if around is None:
            return False
        if id(around) not in self._reducing:
            self._reducing[id(around)] = any(
                isinstance(node, cst.Call) and self.ctx.matches(node.func, *_ALL_REDUCE) for node, _ in walk(around)
            )
        return self._reducing[id(around)]


class _Local:
    """The parameter's name and how a read of its shard is written (`helper(x)`, or `x.to_local()`)."""

    def __init__(self, target: str, helper: str | None = None) -> None:
        self.target = target
        self.helper = helper

    def of(self, tensor: cst.BaseExpression) -> cst.BaseExpression:
        if self.helper is not None:
            return cst.Call(func=cst.Name(self.helper), args=[cst.Arg(tensor)])
        return cst.Call(func=cst.Attribute(value=tensor, attr=cst.Name("to_local")))


class _LocalShards(cst.CSTTransformer):
    """Each value read of the loop's parameter (or of its `.grad`) in the part given, read as the local shard."""

    def __init__(self, local: _Local) -> None:
        super().__init__()
        self.local = local
        self.tensors: set[int] = set()

    def visit_parts(self, part):
        self.tensors = {id(tensor) for tensor, _ in _value_reads([part], self.local.target)}
        return part.visit(self)

    def leave_Name(self, original, updated):
        return self.local.of(updated) if id(original) in self.tensors else updated

    def leave_Attribute(self, original, updated):
        return self.local.of(updated) if id(original) in self.tensors else updated


def _value_reads(scopes: list, target: str) -> list:
    """(the tensor read, its parents) for each read of the values of parameter `target`, of its `.grad` or
    `.data`, in `scopes`; not what only asks its size or whether it has a gradient."""
    reads = []
    for node, parents in walk(*scopes):
        if not (isinstance(node, cst.Name) and node.value == target) or _bound(node, parents):
            continue
        tensor, above = node, list(parents)
        while above and isinstance(above[-1], cst.Attribute) and above[-1].value is tensor and above[-1].attr.value in _TENSOR_OF:
            tensor = above.pop()
        parent = above[-1] if above else None
        if isinstance(parent, cst.Attribute) and parent.value is tensor and parent.attr.value in _NOT_VALUES:
            continue
        if tensor is not node and isinstance(parent, (cst.Comparison, cst.ComparisonTarget)):
            continue  # `p.grad is not None`
        if _local_already(tensor, above) or _scaled_in_place(tensor, above, target):
            continue
        reads.append((tensor, tuple(above)))
    return reads


def _scaled_in_place(tensor, parents: list, target: str) -> bool:
    """`p.grad.mul_(coef)` (or `.detach().mul_(...)`, `.div_(...)`) by what does not read the parameter: each element
    changed alike wherever it lies, the same on a shard, a DTensor or a whole tensor, so nothing to take a shard of."""
    above, current = list(parents), tensor
    while len(above) >= 2 and isinstance(above[-1], cst.Attribute) and above[-1].value is current:
        method, call = above[-1].attr.value, above[-2]
        if not (isinstance(call, cst.Call) and call.func is above[-1]):
            return False
        if method in ("mul_", "div_"):
            return bool(call.args) and not any(
                isinstance(node, cst.Name) and node.value == target for arg in call.args for node, _ in walk(arg)
            )
        if method != "detach" or call.args:
            return False
        current = call
        del above[-2:]
    return False


def _local_already(tensor, parents: list) -> bool:
    """`x.to_local()` or `fsdp2_local(x)`: a shard read the rewrite wrote (a second run leaves it)."""
    parent = parents[-1] if parents else None
    if isinstance(parent, cst.Attribute):
        return parent.value is tensor and parent.attr.value == "to_local"
    call = parents[-2] if isinstance(parent, cst.Arg) and len(parents) >= 2 else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value.startswith(HELPER)


def _chain(tensor, parents: tuple):
    """The method chain the tensor read starts (`p.grad.norm()`), for messages."""
    current = tensor
    for parent in reversed(parents):
        if not (isinstance(parent, cst.Attribute) and parent.value is current or isinstance(parent, cst.Call) and parent.func is current):
            break
        current = parent
    return current


def _handed_parameters(ctx, iterated, reads) -> bool:
    """`params` is an argument of the function around, and the loop reads its items' gradients: parameters handed
    in (`grad_norm_of(model.parameters())`)."""
    if not (isinstance(iterated, cst.Name) and handed_in(ctx, iterated)):
        return False
    return any(isinstance(tensor, cst.Attribute) and tensor.attr.value == "grad" for tensor, _ in reads)


def _is_parameter(tensor) -> bool:
    """`p` or `p.data`, not a gradient."""
    while isinstance(tensor, cst.Attribute) and tensor.attr.value == "data":
        tensor = tensor.value
    return isinstance(tensor, cst.Name)


def _bound(node, parents) -> bool:
    """`node` is (in) the target a loop binds."""
    below = [*parents[1:], node]
    return any(isinstance(loop, (cst.For, cst.CompFor)) and loop.target is child for loop, child in zip(parents, below))


def _summed(tensor, parents: tuple) -> bool:
    """The tensor read under `parents` only enters a sum over its elements, changed one by one first: `.sum()`,
    `torch.sum(...)`, a 2-norm squared. Such sums over shards add up to the sum over the whole tensor."""
    above = list(parents)
    current, node = tensor, above.pop() if above else None
    while True:  # elementwise: `.float()`, `.pow(2)`, `** 2`
        if isinstance(node, cst.Attribute) and node.value is current and node.attr.value in _ELEMENTWISE:
            call = above.pop() if above else None
            if not (isinstance(call, cst.Call) and call.func is node):
                return False
            current = call
        elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Power) and node.left is current:
            if not isinstance(node.right, cst.BaseNumber):
                return False
            current = node
        else:
            break
        node = above.pop() if above else None
    if isinstance(node, cst.Attribute) and node.value is current and node.attr.value in ("sum", "norm"):
        call, first = above.pop() if above else None, 0
        if not (isinstance(call, cst.Call) and call.func is node):
            return False
        reduction = node.attr.value
    elif isinstance(node, cst.Arg) and node.value is current:
        call, first = above.pop() if above else None, 1
        if not (isinstance(call, cst.Call) and call.args and call.args[0] is node):
            return False
        reduction = _FUNCTIONS.get(dotted(call.func))
    else:
        return False
    if reduction == "sum":
        return all(arg.keyword is not None and arg.keyword.value == "dtype" for arg in call.args[first:])
    return reduction == "norm" and _squared_2_norm(call, above[-1] if above else None, first)


def _squared_2_norm(call: cst.Call, parent, first: int) -> bool:
    """`norm(...) ** 2` of the 2-norm (the default) over all elements."""
    squared = (
        isinstance(parent, cst.BinaryOperation)
        and isinstance(parent.operator, cst.Power)
        and parent.left is call
        and isinstance(parent.right, cst.Integer)
        and parent.right.value == "2"
    )
    if not squared:
        return False
    for index, arg in enumerate(call.args[first:]):
        keyword = arg.keyword.value if arg.keyword is not None else ("p" if index == 0 else None)
        order = arg.value.value if isinstance(arg.value, (cst.Integer, cst.Float)) else None
        if keyword != "dtype" and not (keyword in ("p", "ord") and order is not None and float(order) == 2):
            return False
    return True
