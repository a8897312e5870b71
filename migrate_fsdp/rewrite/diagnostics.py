"""What `rewrite` tells the user about an FSDP1 use it did not convert."""

from dataclasses import asdict, dataclass


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"

    def to_json(self) -> dict:
        return asdict(self)


def todo_comment(code: str, message: str) -> str:
    """The one-line marker left in the file above an unconverted use."""
    first_line = message.splitlines()[0] if message else ""
    return f"# TODO(migrate-fsdp): {code} {first_line}".rstrip()
