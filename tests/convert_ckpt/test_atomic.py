"""DST appears complete or not at all: existing DST, --force, interruption mid-write, a failing disk, a failed
--verify."""

import errno
import os
import pathlib
import resource
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner

from migrate_fsdp.convert_ckpt import fileio
from migrate_fsdp.convert_ckpt.atomic import atomic_destination
from migrate_fsdp.convert_ckpt.command import convert_ckpt
from tests.convert_ckpt.helpers import cli, dcp_load, full_checkpoint, same


def leftovers(directory):
    return [name for name in os.listdir(directory) if ".tmp-" in name or ".old-" in name]


def test_existing_dst_needs_force(saved, tmp_path):
    source = full_checkpoint()
    src = saved(source)
    dst = tmp_path / "dcp"
    dst.mkdir()
    (dst / "stale.txt").write_text("old run")
    result = cli(src, dst)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert (dst / "stale.txt").exists()

    assert cli(src, dst, "--force").exit_code == 0
    assert not (dst / "stale.txt").exists()
    assert same(source, dcp_load(dst, source)) == []
    assert leftovers(tmp_path) == []


def test_force_never_replaces_a_directory_holding_src(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    src = run / "ckpt.pt"
    torch.save(full_checkpoint(), src)
    for dst in (run, tmp_path):
        result = cli(src, dst, "--force")
        assert result.exit_code == 2 and "holding SRC" in result.stderr
    assert src.exists() and leftovers(tmp_path) == [] and leftovers(run) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_mid_write_leaves_nothing(saved, tmp_path, signum):
    src = saved({"model": {f"w{i}": torch.zeros(4 << 20) for i in range(8)}})  # 128 MB
    dst = tmp_path / "dcp"
    process = subprocess.Popen(
        [sys.executable, "-m", "migrate_fsdp", "convert-ckpt", str(src), str(dst)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not leftovers(tmp_path) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    os.kill(process.pid, signal.SIGSTOP)  # frozen mid-write: the temporary output exists, DST does not
    assert process.poll() is None, "the conversion finished before it could be interrupted"
    assert leftovers(tmp_path) and not dst.exists()
    os.kill(process.pid, signum)
    os.kill(process.pid, signal.SIGCONT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not dst.exists()
    assert leftovers(tmp_path) == []


def _small_file_limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))


def test_a_failing_write_leaves_nothing(saved, tmp_path):
    src = saved({"model": {"w": torch.zeros(1 << 20)}})  # 4 MB; the child may write at most 1 MB per file
    dst = tmp_path / "dcp"
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "convert-ckpt", str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_small_file_limit,
    )
    assert done.returncode == 2
    assert "File too large" in done.stderr and done.stderr.count("\n") == 1
    assert not dst.exists() and leftovers(tmp_path) == []


def test_verify_lists_every_mismatch_and_writes_nothing(saved, tmp_path, monkeypatch):
    source = {"model": {"a": torch.ones(8), "b": torch.arange(5.0), "c": torch.zeros(2, 3)}, "epoch": 1}
    src = saved(source)
    original = fileio.OutputFile.copy

    def corrupting_copy(self, segment):  # a disk that flips the first byte of every tensor it is given
        if isinstance(segment, fileio.FileSpan):
            data = bytearray(fileio.pread_exact(segment.path, segment.offset, segment.length))
            data[0] ^= 0xFF
            segment = memoryview(bytes(data))
        original(self, segment)

    monkeypatch.setattr(fileio.OutputFile, "copy", corrupting_copy)
    result = CliRunner().invoke(convert_ckpt, [str(src), str(tmp_path / "dcp"), "--verify"])
    assert result.exit_code == 1
    mismatches = [line for line in result.stderr.splitlines() if line.startswith("mismatch: ")]
    assert len(mismatches) == 3
    assert all("1 of" in line and "first at flat index 0" in line for line in mismatches)
    assert "--verify found 3 mismatch(es)" in result.stderr
    assert not (tmp_path / "dcp").exists() and leftovers(tmp_path) == []


def test_an_interrupt_between_the_final_renames_is_held(tmp_path, monkeypatch):
    dst = tmp_path / "dcp"
    dst.mkdir()
    (dst / "old").write_text("old")
    rename = os.rename

    def interrupted_rename(source, target):  # Ctrl-C arrives while DST is being swapped
        os.kill(os.getpid(), signal.SIGINT)
        rename(source, target)

    with atomic_destination(str(dst), is_dir=True, force=True) as temporary:
        (pathlib.Path(temporary) / "new").write_text("new")
        monkeypatch.setattr(os, "rename", interrupted_rename)
    assert sorted(os.listdir(dst)) == ["new"]
    assert leftovers(tmp_path) == []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporaries_of_killed_runs_are_removed(saved, tmp_path):
    src = saved({"model": {"w": torch.ones(4)}})
    dead, alive = _dead_pid(), os.getpid()
    stale_dir, stale_file = tmp_path / f".dcp.tmp-{dead}-0a1b2c3d", tmp_path / f".dcp.tmp-{dead}-deadbeef"
    stale_dir.mkdir()
    (stale_dir / "__0_0.distcp").write_bytes(b"x" * 1000)
    stale_file.write_bytes(b"partial")
    running = tmp_path / f".dcp.tmp-{alive}-00000000"  # a run still going: not ours to remove
    running.mkdir()
    other = tmp_path / f".other.tmp-{dead}-0a1b2c3d"  # beside another DST
    other.mkdir()
    aside = tmp_path / f".dcp.old-{dead}-0a1b2c3d"  # without DST, an .old- is the only copy of the old DST
    aside.mkdir()
    result = cli(src, tmp_path / "dcp")
    assert result.exit_code == 0, result.stderr
    assert not stale_dir.exists() and not stale_file.exists()
    assert running.exists() and other.exists() and aside.exists()
    assert f"removed {stale_dir}, left by a killed run" in result.stderr
    assert f"removed {stale_file}, left by a killed run" in result.stderr


def test_a_write_error_names_dst_not_the_temporary(saved, tmp_path, monkeypatch):
    src = saved({"model": {"w": torch.ones(4)}})
    readonly = tmp_path / "readonly"
    readonly.mkdir()

    def denied(real):  # a read-only directory, also for root
        def call(path, *args, **kwargs):
            if str(path).startswith(str(readonly)):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "mkdir", denied(os.mkdir))
    monkeypatch.setattr(os, "open", denied(os.open))
    for args in ([], ["--to", "torch"]):
        dst = readonly / "out"
        result = cli(src, dst, *args)
        assert result.exit_code == 2
        assert result.stderr.strip() == f"migrate-fsdp convert-ckpt: error: cannot write {dst}: Permission denied"
    assert os.listdir(readonly) == []


def test_a_full_disk_names_dst(saved, tmp_path):
    src = saved({"model": {"w": torch.zeros(1 << 20)}})
    dst = tmp_path / "dcp"
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "convert-ckpt", str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_small_file_limit,
    )
    assert done.returncode == 2
    assert f"cannot write {dst}" in done.stderr and ".tmp-" not in done.stderr
