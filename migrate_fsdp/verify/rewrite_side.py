"""The FSDP2 side made on the fly: our own `rewrite`, written to a temporary directory.

The copy runs with the original's directory as sys.path[0], so that the
script's sibling modules import as they would beside the original.
"""

from pathlib import Path

from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.launcher import Side


def rewritten_side(old_script: Path, args: list, workdir: Path) -> Side:
    try:
        from migrate_fsdp.rewrite.api import rewrite_source
    except ImportError as exc:
        raise VerifyError(f"the rewrite engine is not available ({exc}); pass the FSDP2 version with --new NEW.py") \
            from exc
    # Bytes: the engine honours the script's own encoding declaration, as Python does.
    result = rewrite_source(old_script.read_bytes(), str(old_script))
    if result.diagnostics:
        listed = "; ".join(str(d) for d in result.diagnostics)
        raise VerifyError(f"the rewrite leaves {len(result.diagnostics)} FSDP1 use(s) of {old_script} unconverted, "
                          f"so there is no complete FSDP2 version to run: {listed}")
    if not result.changed:
        raise VerifyError(f"{old_script} has no FSDP1 code for the rewrite to convert; nothing to compare")
    target = workdir / "rewrite" / old_script.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(result.new_source)
    return Side("new", target, list(args), shown=f"rewrite of {old_script}", sys_path=old_script.parent)
