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
    "MF003": "kept FSDP1 with the rest of its model's code",
    "MF004": "model may be FSDP1: convert its FSDP(...) first",
    "MF005": "serves FSDP1 and FSDP2; left as is",
    "MF006": "file cannot be read or written",
    "MF101": "FSDP(...) call left as is",
    "MF102": "FSDP1 auto-wrap policy left as is",
    "MF103": "FSDP1 sharding strategy left as is",
    "MF104": "FSDP1 mixed precision left as is",
    "MF105": "FSDP1 CPU offload left as is",
    "MF106": "FSDP1 process group / mesh left as is",
    "MF107": "FSDP1 ignored modules left as is",
    "MF108": "FSDP1-only argument left as is",
    "MF109": "FSDP1 forward prefetch left as is",
    "MF110": "FSDP1 meta-device init left as is",
    "MF111": "FSDP1 manual wrapping left as is",
    "MF112": "FSDP1 setting left as is",
    "MF201": "no_sync left as is",
    "MF202": "FSDP1 state-dict type left as is",
    "MF203": "FSDP1 optimizer state dict left as is",
    "MF204": "summon_full_params left as is",
    "MF205": "clip_grad_norm_ left as is",
    "MF206": "FSDP1 type check left as is",
    "MF207": "fsdp_modules left as is",
    "MF208": "ShardedGradScaler left as is",
    "MF209": "FSDP1 wrapper attribute left as is",
    "MF210": "subclass of FSDP1's wrapper left as is",
    "MF211": "FSDP1 internal left as is",
    "MF212": "FSDP1 name prefix left as is",
    "MF213": "checkpointing after FSDP1 wrapping",
    "MF214": "parameters changed under no_grad",
    "MF215": "parameter shape or name read: FSDP1's were flat",
    "MF216": "sum of FSDP1 shards all-reduced by hand",
    "MF217": "parameter storage swapped after FSDP1 wrapping",
    "MF218": "clipping norm is now global, not this rank's",
    "MF219": "FSDP1 LOCAL checkpoints do not load here",
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
