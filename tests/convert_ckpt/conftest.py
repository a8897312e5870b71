"""Fixtures for the convert-ckpt tests (helpers live in helpers.py)."""

import pytest
import torch


@pytest.fixture
def saved(tmp_path):
    """saved(obj, name="ckpt.pt") -> path of `obj` written with torch.save."""

    def write(obj, name="ckpt.pt"):
        path = tmp_path / name
        torch.save(obj, path)
        return path

    return write
