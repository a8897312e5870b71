"""The terminal table, the JSON report and the PNG plot, from synthetic outcomes."""

import json
import os
import stat

import pytest

from migrate_fsdp.verify.command import _writing
from migrate_fsdp.verify.compare import compare
from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.faults import RunFailure
from migrate_fsdp.verify.pair import Outcome, overall_exit
from migrate_fsdp.verify.plot import write_plot
from migrate_fsdp.verify.report import write_report
from migrate_fsdp.verify.table import fmt_bytes, render_pair, render_suite
from tests.verify.helpers import CPU, launch, run

LOSSES = [4.5, 4.25, 4.0]


def passing():
    old, new = run("old", LOSSES), run("new", LOSSES)
    return Outcome("pair", launch(), CPU, [old, new], verdict=compare(old, new, 3))


def failing():
    old, new = run("old", LOSSES), run("new", [4.5, 4.5, 4.5])
    return Outcome("bad", launch(), CPU, [old, new], verdict=compare(old, new, 3))


def not_run():
    return Outcome("broken", launch(), CPU, [], [RunFailure("old", "old run crashed on rank 1: boom", "Traceback\nboom")])


def test_pair_table_shows_steps_checks_memory_and_verdict():
    text = render_pair(passing())
    assert "setting: bit-exact" in text
    assert any(line.split()[:3] == ["0", "4.5", "4.5"] for line in text.splitlines())
    assert "[ok] loss: 6 compared, all identical" in text
    assert "rank 1: 1000 B -> 1000 B (1.00x)" in text
    assert text.endswith("verdict: PASS")
    assert render_pair(failing()).endswith("verdict: FAIL (parity)")


def test_a_pair_that_did_not_run_shows_the_failure_and_its_tail():
    text = render_pair(not_run())
    assert "old: old run crashed on rank 1: boom" in text
    assert "    | boom" in text and text.endswith("verdict: NOT RUN")


def test_suite_table_has_a_row_per_pair_and_a_count():
    text = render_suite([passing(), failing(), not_run()], 12.5)
    assert "pair" in text and "FAIL (parity)" in text and "NOT RUN" in text
    assert text.endswith("1 of 3 fixtures pass; 12.5 s")


def test_suite_table_shows_flagged_memory_of_a_passing_fixture():
    old, new = run("old", LOSSES), run("new", LOSSES, peak_bytes=1200)
    outcome = Outcome("pair", launch(), CPU, [old, new], verdict=compare(old, new, 3))
    assert outcome.status == "pass"
    assert "warning: pair: rank 0: new peak memory 1.20x the old one" in render_suite([outcome], 1.0).splitlines()


def test_exit_status_is_the_worst_of_the_pairs():
    assert overall_exit([passing()]) == 0
    assert overall_exit([passing(), failing()]) == 1
    assert overall_exit([failing(), not_run()]) == 2


def test_report_is_complete_json(tmp_path):
    path = tmp_path / "report.json"
    write_report(path, [passing(), not_run()], 2, 3.0)
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["exit_code"] == 2 and not doc["passed"]
    good, bad = doc["pairs"]
    assert good["status"] == "pass" and good["setting"]["exact"]
    assert {c["name"] for c in good["checks"]} >= {"loss", "sharded modules"}
    assert len(good["per_step"]) == 6 and good["memory"][0]["ratio"] == 1.0
    assert good["runs"]["old"]["optimizers"][0]["units"]["layers.0"]["shard_size"] == 2
    assert bad["failures"][0]["message"].startswith("old run crashed")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # nothing left from the atomic write


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "plot.png"
    write_plot(path, [passing(), failing(), not_run()])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_byte_sizes_read_naturally():
    assert [fmt_bytes(n) for n in (None, 512, 2048, 3 * 2**20)] == ["-", "512 B", "2.0 KiB", "3.0 MiB"]


def test_report_and_plot_get_the_users_umask_not_a_private_mode(tmp_path):
    previous = os.umask(0o027)
    try:
        write_report(tmp_path / "report.json", [passing()], 0, 1.0)
        write_plot(tmp_path / "plot.png", [passing()])
    finally:
        os.umask(previous)
    assert [stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("report.json", "plot.png")] == [0o640, 0o640]


def test_a_failed_write_names_the_users_path_not_the_temporary_file(tmp_path):
    def fails():
        raise PermissionError(13, "Permission denied", str(tmp_path / ".report.json.abc123"))

    with pytest.raises(VerifyError) as error:
        _writing(tmp_path / "report.json", fails)
    assert str(error.value).startswith(f"cannot write {tmp_path / 'report.json'}: Permission denied")
