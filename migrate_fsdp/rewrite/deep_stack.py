"""LibCST's parser, metadata providers and visitors recurse once per nesting level of the code, and a chain of
`a + b + ...` nests one level per term: generated code with a few hundred terms passes Python's default limit of
1000 frames, although CPython itself compiles chains of about 3000. So a file is rewritten in a thread of its own,
with a stack large enough for what CPython compiles and a recursion limit to match; the stack is only reserved, not
used, until the recursion goes that deep. What CPython cannot compile either is not tried."""

import sys
import threading

STACK_BYTES = 1 << 30
RECURSION_LIMIT = 250_000
_limit_lock = threading.Lock()


def nesting_python_refuses(data: bytes, path: str) -> str | None:
    """CPython's reason for refusing code nested too deeply, or None. LibCST's native parser has no such limit of
    its own: far deeper code (thousands of parentheses) would crash it, so it is never handed any."""
    try:
        compile(data, path, "exec", dont_inherit=True)
    except (RecursionError, MemoryError) as error:
        return str(error) or type(error).__name__
    except SyntaxError as error:
        return error.msg if "too many nested" in (error.msg or "") else None
    except ValueError:  # null bytes: LibCST reports them
        return None
    return None


def call_with_deep_stack(function, *args, **kwargs):
    """`function(*args, **kwargs)` in a thread with a deep stack; its result, or its exception re-raised here."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # handed back to the caller as it is
            outcome["error"] = error

    with _limit_lock:
        previous_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(previous_limit, RECURSION_LIMIT))
        previous_size = threading.stack_size(STACK_BYTES)
        try:
            thread = threading.Thread(target=target, name="migrate-fsdp-deep-stack", daemon=True)  # Ctrl-C exits
            thread.start()
        finally:
            threading.stack_size(previous_size)
        try:
            thread.join()
        finally:
            sys.setrecursionlimit(previous_limit)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
