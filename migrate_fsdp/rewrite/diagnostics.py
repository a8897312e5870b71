"""What `rewrite` tells the user about an FSDP1 use it did not convert.

The full message (what was found, why it stays, what to write instead) goes to
the report and `--format json`; the file gets a one-line TODO short enough for
any project's line-length check, naming the codes so the reader can look the
rest up (`docs/rules/CODE.md`).
"""

import re
from dataclasses import asdict, dataclass

TODO_PREFIX = "# TODO(migrate-fsdp):"
TODO_WIDTH = 100  # the longest TODO line, indentation included

# The reason a TODO gives, by code: what was left as it is.
TODO_REASONS = {
    "MF001": "file does not parse",
    "MF002": "internal error while rewriting",
    "MF003": "model's FSDP(...) stays FSDP1, so this stays too",
    "MF004": "model may be FSDP1: convert its FSDP(...) first",
    "MF005": "serves FSDP1 and FSDP2; left as is",
    "MF006": "file cannot be read or written",
    "MF101": "FSDP(...) call not converted",
    "MF102": "auto_wrap_policy not converted",
    "MF103": "sharding_strategy not converted",
    "MF104": "mixed_precision not converted",
    "MF105": "cpu_offload not converted",
    "MF106": "process group / device mesh not converted",
    "MF107": "ignored_modules not converted",
    "MF108": "FSDP1-only argument not converted",
    "MF109": "forward_prefetch not converted",
    "MF110": "meta-device init not converted",
    "MF111": "FSDP1 manual wrapping (enable_wrap/wrap)",
    "MF201": "no_sync not converted",
    "MF202": "state-dict type not converted",
    "MF203": "optimizer state dict not converted",
    "MF204": "summon_full_params not converted",
    "MF205": "clip_grad_norm_ not converted",
    "MF206": "FSDP type check not converted",
    "MF207": "fsdp_modules not converted",
    "MF208": "ShardedGradScaler not converted",
    "MF209": "FSDP1 wrapper attribute",
    "MF210": "subclass of FSDP1's wrapper class",
    "MF211": "FSDP1 internal",
    "MF212": "FSDP1 name prefix in names",
    "MF213": "activation checkpointing after FSDP1 wrapping",
    "MF900": "FSDP1 API with no automatic rewrite",
}


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {one_line(self.message)}"

    def to_json(self) -> dict:
        return asdict(self)


def one_line(text: str) -> str:
    """`text` with every run of whitespace (pasted multi-line source included) as one space."""
    return re.sub(r"\s+", " ", text).strip()


def todo_comment(codes, indent: int = 0) -> str:
    """The one TODO line above a statement with unconverted uses of `codes`.

    Codes come first, all of them; then as many whole reasons as fit in
    TODO_WIDTH at this indentation (never a reason cut in the middle).
    """
    codes = sorted(set(codes))
    text = f"{TODO_PREFIX} {', '.join(codes)}"
    reasons = list(dict.fromkeys(TODO_REASONS[code] for code in codes if code in TODO_REASONS))
    for count in range(len(reasons), 0, -1):
        candidate = f"{text} {'; '.join(reasons[:count])}"
        if indent + len(candidate) <= TODO_WIDTH:
            return candidate
    return text


def is_todo(comment: str) -> bool:
    return comment.startswith(TODO_PREFIX)
