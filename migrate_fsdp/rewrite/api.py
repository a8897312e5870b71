"""Rewrite one file's source: the engine's entry point, used by the CLI, `verify` and tests."""

from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrate_fsdp.rewrite.analysis.program import FileFacts, Verdict, decide
from migrate_fsdp.rewrite.context import FileContext
from migrate_fsdp.rewrite.deep_stack import call_with_deep_stack, nesting_python_refuses
from migrate_fsdp.rewrite.diagnostics import Diagnostic
from migrate_fsdp.rewrite.dispatch import Dispatcher
from migrate_fsdp.rewrite.helpers import helper_lines
from migrate_fsdp.rewrite.imports import finish_module
from migrate_fsdp.rewrite.layout import wrap_long_lines
from migrate_fsdp.rewrite.names import may_use_fsdp1
from migrate_fsdp.rewrite.selection import (
    INTERNAL_ERROR,
    LEFTOVER,
    PARSE_ERROR,
    Selection,
)


@dataclass
class RewriteResult:
    path: str
    source: bytes
    new_source: bytes
    diagnostics: list[Diagnostic] = field(default_factory=list)
    encoding: str = "utf-8"

    @property
    def changed(self) -> bool:
        return self.new_source != self.source

    @property
    def code(self) -> str:
        return self.new_source.decode(self.encoding)

    @property
    def failed(self) -> bool:
        """True when the file could not be processed (it does not parse, or we broke)."""
        return any(d.code in (PARSE_ERROR, INTERNAL_ERROR) for d in self.diagnostics)


def worth_parsing(source: bytes, selection: Selection) -> bool:
    if may_use_fsdp1(source):
        return True
    return any(_holds(token, source) for rule in selection.rules() for token in rule.tokens)


def _holds(token: bytes | tuple[bytes, ...], source: bytes) -> bool:
    return token in source if isinstance(token, bytes) else all(part in source for part in token)


class ParsedFile:
    """One file of a program, parsed once; rewritten once, and again if the program's verdict asks."""

    def __init__(self, data: bytes, path: str, selection: Selection, todo: bool, wanted: bool = False) -> None:
        """`wanted`: parse it even if it names nothing of FSDP (the program reads a model's state dict there)."""
        self.data, self.path, self.selection, self.todo = data, path, selection, todo
        self.done: RewriteResult | None = None  # the result, when there is nothing to rewrite
        self.skipped = False  # not parsed, as not worth it
        self._ctx: FileContext | None = None
        if not wanted and not worth_parsing(data, selection):
            self.skipped = True
            self.done = RewriteResult(path, data, data)
            return
        too_deep = nesting_python_refuses(data, path)
        if too_deep:
            message = f"nested deeper than Python compiles ({too_deep}); file skipped"
            self.done = RewriteResult(path, data, data, [Diagnostic(path, 1, 1, PARSE_ERROR, message)])
            return
        try:
            self.module = call_with_deep_stack(cst.parse_module, data)
        except cst.ParserSyntaxError as error:
            message = f"cannot parse: {error.message}; file skipped"
            self.done = RewriteResult(path, data, data, [Diagnostic(path, error.raw_line, error.raw_column + 1, PARSE_ERROR, message)])
        except UnicodeDecodeError as error:  # bytes that are not in the declared (or default UTF-8) encoding
            line_start = data.rfind(b"\n", 0, error.start) + 1
            line, column = data.count(b"\n", 0, error.start) + 1, error.start - line_start + 1
            message = f"cannot decode as {error.encoding} ({error.reason}); declare the file's encoding; file skipped"
            self.done = RewriteResult(path, data, data, [Diagnostic(path, line, column, PARSE_ERROR, message)])

    def rewrite(self, verdict: Verdict | None = None) -> tuple[RewriteResult, FileFacts]:
        """The file rewritten (under `verdict`, or as if every constructor converted), and its facts."""
        if self.done is not None:
            return self.done, FileFacts(self.path)
        return call_with_deep_stack(self._rewrite, verdict)

    def _rewrite(self, verdict: Verdict | None) -> tuple[RewriteResult, FileFacts]:
        try:
            if self._ctx is None:
                wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
                text = self.data.decode(self.module.encoding, errors="replace")
                self._ctx = FileContext(self.path, wrapper, self.selection.codes, self.todo, text)
                ctx = self._ctx
            else:
                ctx = self._ctx.with_verdict(verdict)
            return _rewrite_module(ctx, self.module, self.data, self.selection), ctx.program.facts
        except Exception as error:  # a bug of ours must not stop a run over a whole tree
            message = f"internal error ({type(error).__name__}: {error}); file left unchanged, please report it"
            diagnostic = Diagnostic(self.path, 1, 1, INTERNAL_ERROR, message)
            return RewriteResult(self.path, self.data, self.data, [diagnostic], self.module.encoding), FileFacts(self.path)


def rewrite_program(files: list[ParsedFile], sources: Mapping[str, bytes] | None = None) -> list[RewriteResult]:
    """Rewrite files that form one program: each model converts together with all its uses, or not at all.
    `sources`: every file of the program by path, also those not worth parsing (default: `files`)."""
    if not files:
        return []
    sources = sources if sources is not None else {f.path: f.data for f in files}
    by_path = {file.path: file for file in files}
    first = {path: file.rewrite() for path, file in by_path.items()}
    parsed = {path for path, file in by_path.items() if not file.skipped}
    verdicts, failure, late = decide_with_late_files(first, parsed, sources, files[0].selection, files[0].todo)
    by_path.update((file.path, file) for file in late)  # a file given but skipped keeps its place
    if failure is not None:
        return [left_unchanged(first[path][0], failure) for path in by_path]
    results = [file.rewrite(verdicts[path])[0] if path in verdicts else first[path][0] for path, file in by_path.items()]
    return whole_or_untouched(results)


def whole_or_untouched(results: list[RewriteResult]) -> list[RewriteResult]:
    """`results`, unless a bug of ours stopped the rewrite of a file of the program: its FSDP1 code may be a use of
    models the other files convert, so nothing changes (a half-migrated program is worse than an untouched one). A
    file that does not parse is no such risk: Python cannot run it either."""
    broken = next((r for r in results if any(d.code == INTERNAL_ERROR for d in r.diagnostics)), None)
    if broken is None or not any(r.changed for r in results):
        return results
    message = f"left unchanged with the rest of its program: an internal error in {broken.path}, whose FSDP1 code may use this file's models"
    return [_as_it_was(r, message) if r.changed else r for r in results]


def decide_with_late_files(
    first: dict, parsed: set[str], sources: Mapping[str, bytes], selection: Selection, todo: bool
) -> tuple[dict[str, Verdict], Exception | None, list[ParsedFile]]:
    """The program's verdicts from `first` (path -> first rewrite and facts, or None), and the files it has verdicts
    for but did not parse (`parsed`: the paths it did): they name no FSDP, and the program reads the state dict of one
    of its models there (analysis/program.py, STATE_METHODS). Those are parsed here, their first rewrites join
    `first`, and the program decided again with their facts."""
    verdicts, failure = decide_safely([facts for _, facts in first.values() if facts is not None], sources)
    if failure is not None:
        return verdicts, failure, []
    late = [ParsedFile(sources[path], path, selection, todo, wanted=True) for path in sorted(set(verdicts) - parsed)]
    if late:
        first.update((file.path, file.rewrite()) for file in late)
        verdicts, failure = decide_safely([facts for _, facts in first.values() if facts is not None], sources)
    return verdicts, failure, late


def decide_safely(facts: list[FileFacts], sources: Mapping[str, bytes]) -> tuple[dict[str, Verdict], Exception | None]:
    """The program's verdicts, or the error of ours that kept them from being reached (then nothing converts)."""
    try:
        return decide(facts, sources), None
    except Exception as error:
        return {}, error


def left_unchanged(result: RewriteResult, error: Exception) -> RewriteResult:
    """`result`'s file as it was, with an internal error: the program's verdict could not be reached."""
    message = f"internal error ({type(error).__name__}: {error}) in the program model; file left unchanged, please report it"
    return _as_it_was(result, message)


def _as_it_was(result: RewriteResult, message: str) -> RewriteResult:
    """`result`'s file unchanged, with one internal-error finding saying why."""
    return RewriteResult(result.path, result.source, result.source, [Diagnostic(result.path, 1, 1, INTERNAL_ERROR, message)], result.encoding)


def rewrite_source(
    source: str | bytes,
    path: str = "<string>",
    selection: Selection | None = None,
    todo: bool = True,
) -> RewriteResult:
    """Rewrite FSDP1 code in `source`, a program of one file; never raises for bad input, it reports it."""
    selection = selection or Selection.from_prefixes(None, None)
    data = source.encode("utf-8") if isinstance(source, str) else source
    return rewrite_program([ParsedFile(data, path, selection, todo)])[0]


def _rewrite_module(ctx: FileContext, module: cst.Module, data: bytes, selection: Selection) -> RewriteResult:
    path = ctx.path
    rules = [rule(ctx) for rule in selection.rules()]
    dispatcher = Dispatcher(ctx, rules, catch_leftovers=LEFTOVER in selection)
    new_module = dispatcher.run()
    ctx.program.meet()
    diagnostics = ctx.diagnostics()
    if not dispatcher.changed:
        return RewriteResult(path, data, data, diagnostics, module.encoding)
    verdict = ctx.program.verdict
    finished, ctx.program.facts.dropped_imports = finish_module(
        new_module, ctx.imports, ctx.helpers, module, verdict.kept_imports if verdict is not None else frozenset()
    )
    new_data = wrap_long_lines(finished, data.decode(module.encoding, errors="replace"), helper_lines()).bytes
    if new_data != data:
        cst.parse_module(new_data)  # never hand back code that does not parse
    return RewriteResult(path, data, new_data, diagnostics, module.encoding)
