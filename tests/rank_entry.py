"""What each torchrun rank runs in tests: the script, then an immediate exit, as verify's set-up runs do
(migrate_fsdp/verify/script_entry.py says why: gloo's teardown race).

Usage: torchrun ... tests/rank_entry.py SCRIPT [ARGS...]
"""

import sys

from migrate_fsdp.verify.script_entry import main

if __name__ == "__main__":
    main(sys.argv[1:])
