"""The rank metrics file survives a rank dying mid-write."""

from migrate_fsdp.verify import metrics


def test_round_trip_and_torn_last_line(tmp_path):
    path = metrics.metrics_path(tmp_path, 1)
    writer = metrics.MetricsWriter(path)
    writer.write("start", rank=1, world_size=2, pid=1)
    writer.write("setup", device="cpu", units={})
    writer.write("step", step=0, loss=1.5)
    writer.close()
    with open(path, "a") as handle:
        handle.write('{"event": "step", "st')
    read = metrics.read_rank(path, 1)
    assert read.started and read.world_size == 2 and read.setups[0]["device"] == "cpu"
    assert read.steps == [{"step": 0, "loss": 1.5}]
    assert read.status == "missing"


def test_a_rank_that_never_started_has_no_file(tmp_path):
    read = metrics.read_rank(metrics.metrics_path(tmp_path, 0), 0)
    assert not read.started and read.status == "missing"
