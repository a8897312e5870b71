"""What the training-loop rules share: the FSDP1-model analysis and readers of FSDP1 calls.

Every training rule feeds the shared analysis (models.py) from the same
read-only hooks, so it is complete whichever subset of rules is selected. A
rule that needs one of these hooks for itself calls `super()` first.
"""

import libcst as cst

from migrate_fsdp.rewrite.rule import FSDP2_MODELS, Rule
from migrate_fsdp.rewrite.analysis.guards import checked_instance, in_fsdp_branch
from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS, FsdpModels, Kind, assignments_of, fsdp_models
from migrate_fsdp.rewrite.syntax import chain_root, dotted


_TYPE_CHECKS = ("builtins.isinstance", "builtins.issubclass")
_CASTS = ("typing.cast", "typing_extensions.cast")
NEEDS_WRAP_CALL = "not converted: MF101 (wrap-call) is not selected, so the models stay FSDP1; select it too"
# A file importing FSDP2 names may hold what an earlier run converted or reported (`model: FSDPModule`
# with a `.module` left on it): every training rule parses it, so a re-run reports the same. (The
# rewrite always imports them as `from torch.distributed.fsdp import ...`.)
FSDP2_TOKENS = (b"fsdp import",)


class TrainingRule(Rule):
    tokens = FSDP2_TOKENS
    reports_model_uses = True

    @property
    def models(self) -> FsdpModels:
        return fsdp_models(self.ctx)

    def collect_Assign(self, node) -> None:
        self.models.note(node)

    def collect_AnnAssign(self, node) -> None:
        self.models.note(node)

    def collect_AugAssign(self, node) -> None:
        self.models.note(node)

    def collect_For(self, node) -> None:
        self.models.note(node)

    def collect_WithItem(self, node) -> None:
        self.models.note(node)

    def collect_If(self, node) -> None:
        self.models.note(node)

    def collect_While(self, node) -> None:
        self.models.note(node)

    def collect_BooleanOperation(self, node) -> None:
        self.models.note(node)

    def collect_IfExp(self, node) -> None:
        self.models.note(node)

    def collect_Assert(self, node) -> None:
        self.models.note(node)

    def collect_FunctionDef(self, node) -> None:
        self.models.note(node)

    def collect_Return(self, node) -> None:
        self.models.note(node)

    def collect_Call(self, node) -> None:
        self.models.note(node)

    def collect_Import(self, node) -> None:
        self.models.note(node)

    def collect_ImportFrom(self, node) -> None:
        self.models.note(node)

    # ----- readers -----------------------------------------------------------------------

    def fsdp_method(self, func) -> str | None:
        """`name` when `func` is `FSDP.name` (the class attribute, however FSDP was imported)."""
        if not isinstance(func, cst.Attribute):
            return None
        name = func.attr.value
        return name if self.ctx.matches(func, f"{FSDP_CLASS}.{name}") else None

    def model_method(self, func, *names: str) -> str | None:
        """`name` when `func` is `x.name` for one of `names` (the receiver is not checked)."""
        if isinstance(func, cst.Attribute) and func.attr.value in names and not self.fsdp_method(func):
            return func.attr.value
        return None

    def fsdp2_ahead(self, node, stack=None, governed: bool = False) -> bool:
        """Whether FSDP2 code may replace the original `node`: only when the models it uses become
        FSDP2 ones, which the program decides (analysis/program.py); otherwise `node` is reported.
        `governed`: it sits in a `with FSDP.state_dict_type(...)` block (Gate.use)."""
        if FSDP2_MODELS not in self.ctx.capabilities:
            self.ctx.report(node, self.code, NEEDS_WRAP_CALL)
            return False
        denial = self.ctx.program.use(node, self.code, tuple(self.ctx.stack if stack is None else stack), governed=governed)
        if denial is None:
            return True
        if denial.code is not None:
            self.ctx.report(node, denial.code, denial.message)
        return False

    def in_type_position(self) -> bool:
        """The node being visited stands where a class is a type: an annotation, the class of an
        `isinstance` / `issubclass` (alone or in a tuple), the type of a `typing.cast`."""
        stack = self.ctx.stack
        if any(isinstance(n, cst.Annotation) for n in stack):
            return True
        node, parent = stack[-1], stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Element) and len(stack) >= 5 and isinstance(stack[-3], cst.Tuple):
            node, parent = stack[-3], stack[-4]
        call = stack[stack.index(parent) - 1] if isinstance(parent, cst.Arg) else None
        if not isinstance(call, cst.Call) or parent.value is not node:
            return False
        if self.ctx.matches(call.func, *_TYPE_CHECKS):
            return len(call.args) == 2 and call.args[1] is parent
        return self.ctx.matches(call.func, *_CASTS) and call.args[0] is parent

    def receiver_kind(self, func: cst.Attribute) -> Kind:
        """What the receiver of `func` is; an FSDP1 model also where the code runs only if
        `isinstance(receiver, FSDP)` holds (`m.module if isinstance(m, FSDP) else m`)."""
        receiver = dotted(func.value)
        if not receiver:
            return Kind.UNKNOWN
        kind = self.models.kind(func.value)
        if kind is Kind.UNKNOWN and checked_instance(self.ctx, self.ctx.stack, receiver, FSDP_CLASS):
            return Kind.FSDP
        return kind

    def model_method_receiver_kind(self, func: cst.Attribute) -> Kind:
        """`receiver_kind` for a method only FSDP1 models have among modules (`clip_grad_norm_(max_norm)`,
        `no_sync()`): a receiver of unknown origin in a branch a guard naming FSDP takes (`if cfg.enable_fsdp:`),
        or anywhere in a program where nothing else has those methods (no DDP), is taken for an FSDP model, of a
        program that builds FSDP1 models."""
        kind = self.receiver_kind(func)
        program = self.ctx.program
        if kind is not Kind.UNKNOWN or self._imported(func.value):  # `torch.nn.utils.clip_grad_norm_`: a function
            return kind
        if (in_fsdp_branch(self.ctx.stack) or program.fsdp1_receiver(func)) and program.may_build_fsdp1():
            return Kind.FSDP
        return kind

    def _imported(self, receiver) -> bool:
        """Whether `receiver` is, or is an attribute of, a name an import binds (a module, a class)."""
        root = chain_root(receiver)
        bindings = assignments_of(self.ctx.scope(receiver), root) if root else []
        return bool(bindings) and all(isinstance(a.node, (cst.Import, cst.ImportFrom)) for a in bindings)

    def is_statement_call(self) -> bool:
        """The node being left is a whole expression statement (its value is not used)."""
        stack = self.ctx.stack
        return len(stack) >= 2 and isinstance(stack[-2], cst.Expr)


def bind(call: cst.Call, params: tuple[str, ...]) -> dict[str, cst.Arg] | None:
    """The arguments of `call` by parameter name, for a signature `params`; None when unknowable."""
    bound: dict[str, cst.Arg] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None:
            if index >= len(params):
                return None
            bound[params[index]] = arg
        else:
            name = arg.keyword.value
            if name not in params or name in bound:
                return None
            bound[name] = arg
    return bound


def literal_bool(node) -> bool | None:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def code_of(ctx, node) -> str:
    """Source text of an original node on one line, for messages."""
    return " ".join(ctx.code(node).split())


def from_template(template: str, **values: cst.BaseExpression) -> cst.BaseExpression:
    """Parse `template` and put the given expressions where its upper-case placeholder names stand."""
    return cst.parse_expression(template).visit(_Substitute(values))


class _Substitute(cst.CSTTransformer):
    def __init__(self, values: dict) -> None:
        super().__init__()
        self.values = values

    def leave_Name(self, original, updated):
        return self.values.get(updated.value, updated)


_PENDING_KEY = "training.pending_comments"


class RemovesStatements(TrainingRule):
    """Removing whole statements without losing the comments above or after them.

    A removed statement's comment lines move onto the statement that follows
    it in the same block (or to the block's end), so every statement kind
    gets a leave hook that picks them up. `unwrap_with` splices a `with`
    block's body into the enclosing block, in the same spirit.
    """

    def remove_statement(self, original):
        # A comment above the statement stays, with the blank lines that set it apart.
        comments = list(original.leading_lines) if any(line.comment for line in original.leading_lines) else []
        whitespace = getattr(original, "trailing_whitespace", None)  # a compound statement has none
        trailing = whitespace.comment if whitespace is not None else None
        if trailing is not None:  # `cfg = FullStateDictConfig(...)  # why`: the comment goes on its own line
            comments.append(cst.EmptyLine(comment=trailing))
        self._defer_comments(comments)
        self.ctx.mark_handled(original)
        return cst.RemoveFromParent()

    def _defer_comments(self, comments: list) -> None:
        """Comment lines of the statement being left, for the next statement of its block (or the block's end)."""
        if comments:
            block = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
            self.ctx.facts.setdefault(_PENDING_KEY, {}).setdefault(id(block), []).extend(comments)

    def _take_pending(self, block) -> list:
        return self.ctx.facts.get(_PENDING_KEY, {}).pop(id(block), [])

    def attach_pending(self, original, updated):
        block = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        pending = self._take_pending(block)
        if pending and hasattr(updated, "leading_lines"):
            return updated.with_changes(leading_lines=[*pending, *updated.leading_lines])
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_If(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_For(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_While(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_With(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_Try(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_FunctionDef(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_ClassDef(self, original, updated):
        return self.attach_pending(original, updated)

    def leave_IndentedBlock(self, original, updated):
        pending = self._take_pending(original)
        return updated.with_changes(footer=[*pending, *updated.footer]) if pending else updated

    def leave_Module(self, original, updated):
        pending = self._take_pending(original)
        return updated.with_changes(footer=[*pending, *updated.footer]) if pending else updated

    def unwrap_with(self, updated: cst.With, *item_indexes: int):
        """`updated` without its items `item_indexes`; the body spliced in its place when they were all its items.

        Called from `leave_With`; the comments closing the body go after the spliced statements.
        """
        items = [item for index, item in enumerate(updated.items) if index not in item_indexes]
        if items:
            items[-1] = items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(items=items)
        body = updated.body
        if isinstance(body, cst.SimpleStatementSuite):
            statements = [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)]
        else:
            statements = list(body.body)
            if body.header.comment is not None:
                statements[0] = statements[0].with_changes(
                    leading_lines=[cst.EmptyLine(comment=body.header.comment), *statements[0].leading_lines]
                )
            self._defer_comments([line for line in body.footer if line.comment is not None])
        statements[0] = statements[0].with_changes(leading_lines=[*updated.leading_lines, *statements[0].leading_lines])
        return cst.FlattenSentinel(statements)
