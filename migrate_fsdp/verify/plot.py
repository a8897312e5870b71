"""`--plot`: the two loss curves and the per-rank peak memory bars of every pair, in one PNG.

matplotlib is an optional extra (`pip install 'migrate-fsdp[plot]'`).
"""

from pathlib import Path

from migrate_fsdp.verify.atomic import atomic_path
from migrate_fsdp.verify.errors import VerifyError


def write_plot(path: Path, outcomes: list) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise VerifyError("--plot needs matplotlib: pip install 'migrate-fsdp[plot]'") from exc
    judged = [o for o in outcomes if o.verdict is not None]
    if not judged:
        raise VerifyError("--plot: no pair ran to completion, nothing to plot")
    fig, axes = plt.subplots(len(judged), 2, figsize=(11, 3.2 * len(judged)), squeeze=False)
    for (loss_ax, mem_ax), outcome in zip(axes, judged):
        rows = outcome.verdict.steps
        rank = rows[0]["rank"]
        steps = [r["step"] for r in rows if r["rank"] == rank]
        loss_ax.plot(steps, [r["loss_old"] for r in rows if r["rank"] == rank], "o-", label="old (FSDP1)")
        loss_ax.plot(steps, [r["loss_new"] for r in rows if r["rank"] == rank], "x--", label="new (FSDP2)")
        loss_ax.set_title(f"{outcome.name}: loss, rank {rank} [{outcome.status}]", fontsize=9)
        loss_ax.set_xlabel("optimizer step")
        loss_ax.legend(fontsize=8)
        memory = outcome.verdict.memory
        ranks = [m["rank"] for m in memory]
        width = 0.38
        mem_ax.bar([r - width / 2 for r in ranks], [m["old_peak"] / 2**20 for m in memory], width, label="old")
        mem_ax.bar([r + width / 2 for r in ranks], [m["new_peak"] / 2**20 for m in memory], width, label="new")
        mem_ax.set_title("peak memory per rank (MiB)", fontsize=9)
        mem_ax.set_xticks(ranks)
        mem_ax.set_xlabel("rank")
        mem_ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
