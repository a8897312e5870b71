"""Which rules and codes a run uses: `--select` / `--ignore` by code prefix, as in ruff."""

from dataclasses import dataclass

from migrate_fsdp.rewrite.analysis.program import BLOCKED, DUAL_VERSION, KEPT_FSDP1
from migrate_fsdp.rewrite.rules import RULES

PARSE_ERROR = "MF001"
INTERNAL_ERROR = "MF002"
IO_ERROR = "MF006"
LEFTOVER = "MF900"

# Codes the engine itself emits. Errors cannot be deselected: a file that was
# not processed must always be said.
ENGINE_CODES = {
    PARSE_ERROR: "file does not parse; skipped",
    INTERNAL_ERROR: "internal error while rewriting; file left unchanged",
    BLOCKED: "use of a model whose FSDP1 constructor stays: left as is, with the constructor",
    KEPT_FSDP1: "use of a model from out of sight while the program keeps FSDP1 models: left as is",
    DUAL_VERSION: "code that already serves FSDP1 and FSDP2: left as is",
    IO_ERROR: "file cannot be read or written; left unchanged",
    LEFTOVER: "FSDP1 reference that no rule converted or reported",
}
# Errors, and what keeps a program from being half migrated, are always said.
_ALWAYS_ON = frozenset({PARSE_ERROR, INTERNAL_ERROR, IO_ERROR, BLOCKED, KEPT_FSDP1, DUAL_VERSION})


def all_codes() -> dict[str, str]:
    codes = {rule.code: rule.summary for rule in RULES}
    codes.update(ENGINE_CODES)
    return dict(sorted(codes.items()))


class UnknownCode(ValueError):
    pass


@dataclass(frozen=True)
class Selection:
    codes: frozenset

    @classmethod
    def from_prefixes(cls, select: list[str] | None, ignore: list[str] | None) -> "Selection":
        known = all_codes()
        for prefix in [*(select or []), *(ignore or [])]:
            if not any(code.startswith(prefix) for code in known):
                raise UnknownCode(f"unknown rule code or prefix {prefix!r} (see `migrate-fsdp rewrite --list-codes`)")
        chosen = set()
        for code in known:
            # The catch-all is not a rewrite: it stays on under --select unless ignored.
            picked = not select or code == LEFTOVER or any(code.startswith(p) for p in select)
            dropped = any(code.startswith(p) for p in ignore or [])
            if code in _ALWAYS_ON or (picked and not dropped):
                chosen.add(code)
        return cls(frozenset(chosen))

    def rules(self) -> list:
        return [rule for rule in RULES if rule.code in self.codes]

    def __contains__(self, code: str) -> bool:
        return code in self.codes
