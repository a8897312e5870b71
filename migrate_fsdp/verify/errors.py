"""The one error type of `verify`: a run that could not be done (exit 2, one line)."""


class VerifyError(Exception):
    """Shown to the user as `migrate-fsdp verify: error: <message>`; the message is one line."""
