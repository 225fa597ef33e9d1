"""A sharded checkpoint is checked before DCP unpickles it (:mod:`dflash.checkpoint.dcp_check`).

A real DCP checkpoint is written here in one process (``dcp.save(no_dist=True)``, tensors
and plain values as the trainer's optimizer has them), then tampered with as an attacker
would: a ``.metadata`` whose pickle calls a function, a plain value replaced by a pickle
that does, a shard named outside the folder. Each planted payload would create a marker
file when run; the check refuses it and the marker never appears. The first test shows
that DCP's own reader does run it, so the check is what stands between."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch

from dflash.checkpoint.dcp_check import check_dcp, read_metadata
from dflash.checkpoint.sharded import read_sharded_full
from dflash.errors import CheckpointError


class Planted:
    """A pickle that, when loaded, creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mknod, (str(self.marker),))


def _checkpoint(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    state = {"model": {"fc.weight": torch.ones(2, 3)},
             "optim": {"state": {"fc.weight": {"step": torch.tensor(3.0),
                                               "exp_avg": torch.zeros(2, 3)}},
                       "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99),
                                         "params": ["fc.weight"]}]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return folder


def _plant_value(folder: Path, marker: Path) -> str:
    """Point the first plain value's entry at a new shard file holding a planted pickle."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    meta = read_metadata(folder)
    fqn, index = next((i.fqn, i) for i in meta.storage_data
                      if isinstance(meta.state_dict_metadata[i.fqn], BytesStorageMetadata))
    buffer = io.BytesIO()
    torch.save(Planted(marker), buffer)  # what DCP's own writer stores a value as
    payload = buffer.getvalue()
    (folder / "planted.distcp").write_bytes(payload)
    meta.storage_data[index] = dataclasses.replace(
        meta.storage_data[index], relative_path="planted.distcp", offset=0,
        length=len(payload))
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    return fqn


def test_a_checkpoint_the_trainer_writes_passes(tmp_path: Path):
    folder = _checkpoint(tmp_path / "ckpt")
    check_dcp(folder)
    names = ["fc.weight"]
    weights, optim = read_sharded_full(folder, names)
    assert torch.equal(weights["fc.weight"], torch.ones(2, 3))
    assert optim["param_groups"][0]["lr"] == 0.1


def test_dcp_itself_runs_a_planted_value(tmp_path: Path):
    """Without the check: torch's own conversion loads the planted value, and it runs."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = _checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    _plant_value(folder, marker)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(folder, tmp_path / "full.pt")  # no error: the value is mknod's None
    assert marker.exists()


def test_a_planted_value_is_refused_and_never_run(tmp_path: Path):
    folder = _checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    fqn = _plant_value(folder, marker)
    with pytest.raises(CheckpointError, match=rf"planted\.distcp: {fqn} is not plain data: "
                                              r"Trying to load unsupported GLOBAL posix\.mknod"):
        read_sharded_full(folder, ["fc.weight"])
    assert not marker.exists()


def test_a_planted_metadata_is_refused_and_never_run(tmp_path: Path):
    folder = _checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata: not a checkpoint's metadata: "
                                              r"posix\.mknod is not part of"):
        check_dcp(folder)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["../outside.distcp", "/etc/passwd", ".."])
def test_a_shard_named_outside_the_folder_is_refused(tmp_path: Path, name: str):
    folder = _checkpoint(tmp_path / "ckpt")
    meta = read_metadata(folder)
    index = next(iter(meta.storage_data))
    meta.storage_data[index] = dataclasses.replace(meta.storage_data[index],
                                                   relative_path=name)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        check_dcp(folder)


def test_a_metadata_that_is_a_link_or_a_fifo_is_refused(tmp_path: Path):
    folder = _checkpoint(tmp_path / "ckpt")
    (folder / ".metadata").rename(tmp_path / "elsewhere")
    (folder / ".metadata").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        check_dcp(folder)
    (folder / ".metadata").unlink()
    os.mkfifo(folder / ".metadata")
    with pytest.raises(CheckpointError, match="is a FIFO"):
        check_dcp(folder)
