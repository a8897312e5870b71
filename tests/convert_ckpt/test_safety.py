"""Nothing in a checkpoint runs unless the user opts in: the unpickler's allow-list, proven with a pickle that
would act."""

import pickle

import torch
import torch.distributed.checkpoint as dcp

from tests.convert_ckpt.helpers import cli, cli_process, full_checkpoint


class Payload:
    """Unpickling this runs exec(), which would create `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_code_in_a_pickle_is_refused_without_running(saved, tmp_path):
    marker = tmp_path / "payload-ran"
    src = saved({**full_checkpoint(), "hook": Payload(marker)})
    done = cli_process(src, tmp_path / "dcp")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "builtins.exec" in done.stderr and "--unsafe-pickle" in done.stderr
    assert not marker.exists()
    assert not (tmp_path / "dcp").exists()


def test_unsafe_pickle_opt_in_runs_it_and_warns(saved, tmp_path):
    marker = tmp_path / "payload-ran"
    src = saved({**full_checkpoint(), "hook": Payload(marker)})
    result = cli(src, tmp_path / "dcp", "--unsafe-pickle")
    assert result.exit_code == 0, result.output
    assert "warning: --unsafe-pickle" in result.stderr
    assert marker.read_text() == "ran"


def test_unknown_classes_are_named(saved, tmp_path):
    src = saved({**full_checkpoint(), "optimizer_class": torch.optim.AdamW})
    result = cli(src, tmp_path / "dcp")
    assert result.exit_code == 2
    assert "torch.optim.adamw.AdamW" in result.stderr


def test_code_in_a_dcp_value_is_refused(tmp_path):
    marker = tmp_path / "payload-ran"
    dcp.save(
        {"model": {"w": torch.ones(2)}, "hook": Payload(marker)}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True
    )
    result = cli(tmp_path / "dcp", tmp_path / "full.pt", "--to", "torch")
    assert result.exit_code == 2 and "builtins.exec" in result.stderr
    assert not marker.exists()


def test_code_in_dcp_metadata_is_refused(tmp_path):
    marker = tmp_path / "payload-ran"
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    result = cli(tmp_path / "dcp", tmp_path / "full.pt", "--to", "torch")
    assert result.exit_code == 2 and "builtins.exec" in result.stderr
    assert not marker.exists()
