"""Unified diffs that `git apply` and `patch -p1` accept, byte-faithful (CRLF, encodings)."""

import difflib

_NO_NEWLINE = "\\ No newline at end of file\n"


def _lines(text: str) -> list[str]:
    # Not str.splitlines: it also splits on \x0c, \u2028 and friends inside strings.
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(display_path: str, old: str, new: str) -> str:
    out = []
    for line in difflib.unified_diff(_lines(old), _lines(new), f"a/{display_path}", f"b/{display_path}"):
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n" + _NO_NEWLINE)
    return "".join(out)
