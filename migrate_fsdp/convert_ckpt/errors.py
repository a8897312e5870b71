"""The failures `convert-ckpt` reports as one line, with the exit code each maps to."""


class ConvertError(Exception):
    """Bad input, bad usage or a failed write: reported as one line, exit 2."""

    exit_code = 2


class Refused(ConvertError):
    """An input this tool will not convert; the message names what to do instead."""


class UnsafePickle(ConvertError):
    """The pickle names globals outside the allow-list; nothing from it was run."""

    def __init__(self, names):
        self.names = sorted(set(names))
        super().__init__(
            f"refusing to unpickle {', '.join(self.names)}: not on the allow-list of harmless globals; "
            "if you trust this file, rerun with --unsafe-pickle"
        )


class Mismatch(ConvertError):
    """`--verify` or `--check-against` found problems (already listed): exit 1."""

    exit_code = 1
