"""The live line: steps counted from rank 0's metrics file as it grows, shown only on a terminal."""

import io
import types

from migrate_fsdp.verify.metrics import MetricsWriter, metrics_path
from migrate_fsdp.verify.progress import LiveLine


def test_counts_the_steps_written_so_far_and_clears_itself(tmp_path):
    stream = io.StringIO()
    line = LiveLine(None, stream)
    running = [types.SimpleNamespace(side=types.SimpleNamespace(name="old"), directory=tmp_path)]
    line.update(running)  # the rank has not started: no file yet
    writer = MetricsWriter(metrics_path(tmp_path, 0))
    writer.write("start", rank=0)
    for step in range(3):
        writer.write("step", step=step)
    line.update(running)
    writer.write("step", step=3)
    line.update(running)
    line.clear()
    shown = stream.getvalue().split("\r\x1b[K")
    assert shown[1] == "old: step 0/??"
    assert shown[2] == "old: step 3/??" and shown[3].startswith("old: step 4/?? ") and shown[3].endswith(" s/step")
    assert shown[4] == ""


def test_nothing_is_written_off_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert LiveLine.for_terminal(5) is None
