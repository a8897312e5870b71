"""What each torchrun rank runs for a script `verify` does not watch (a fixture's set-up run): the script, then
an immediate exit.

torch's gloo backend sometimes aborts a rank while the interpreter tears down
("terminate called without an active exception", SIGABRT) after the script
has finished and printed everything: a race between gloo's threads and C++
static destructors, not in the script. Leaving with `os._exit` once the
script returns skips that teardown (as the probe does for watched runs); an
exception or `sys.exit` in the script still ends the rank as it would have.

Usage: torchrun ... -m migrate_fsdp.verify.script_entry SCRIPT [ARGS...]
"""

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
