"""What each torchrun rank runs in tests: the script, then an immediate exit.

torch's gloo backend sometimes aborts a rank while the interpreter tears down
("terminate called without an active exception", SIGABRT) after the script
has finished and printed everything: a race between gloo's threads and C++
static destructors, not in the code under test. Leaving with `os._exit` once
the script returns skips that teardown (as `verify`'s probe does); an
exception or `sys.exit` in the script still ends the rank as it would have.

Usage: torchrun ... tests/rank_entry.py SCRIPT [ARGS...]
"""

import os
import runpy
import sys

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
