"""A sharded (DCP) checkpoint checked before torch.distributed.checkpoint reads it.

DCP unpickles a checkpoint's ``.metadata`` with :mod:`pickle` and every value that is not
a tensor (the optimizer's ``step``, its learning rates) with ``torch.load(...,
weights_only=False)``: a planted file in a checkpoint folder, one downloaded or shared,
would run whatever code it names on resume. :func:`check_dcp` reads both first, without
running anything: ``.metadata`` with an unpickler that builds only the classes a DCP
checkpoint's metadata is made of (:data:`METADATA_CLASSES`, a torch dtype, ``torch.Size``),
and each non-tensor value with ``torch.load(weights_only=True)``; it also refuses a shard
file named outside the folder. DCP then reads the same files (tensors it already loads
with ``weights_only=True``).
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dflash.errors import CheckpointError
from envguard.input_file import NotReadable, read_bounded, read_range

METADATA_NAME = ".metadata"
METADATA_BYTES = 256 << 20
"""256 MiB: a DCP ``.metadata`` (an 8B drafter's, sharded 8 ways, is a few MB)."""
VALUE_BYTES = 64 << 20
"""64 MiB: one non-tensor value (a number, a list of learning rates)."""

_DCP = "torch.distributed.checkpoint"
METADATA_CLASSES = frozenset({
    *((f"{_DCP}.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING")),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name, from torch's own table
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # the checkpoint id
    ("collections", "OrderedDict"),
})
"""(module, name) of every class a DCP checkpoint's metadata is built from, recorded from
the checkpoints this trainer wrote under torch 2.13 (another torch that pickles another
class is refused with a line naming it)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_CLASSES or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """A checkpoint file's read, its refusals as CheckpointError naming it."""
    try:
        yield
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing from the checkpoint") from None
    except NotReadable as exc:
        raise CheckpointError(str(exc)) from None


def read_metadata(folder: Path) -> Any:
    """The checkpoint's DCP ``Metadata``, unpickled without building anything else."""
    path = folder / METADATA_NAME
    with _reading(path):
        raw = read_bounded(path, limit=METADATA_BYTES, what="checkpoint file", follow=False)
    try:
        meta = _MetadataUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError,
            IndexError, KeyError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not a checkpoint's metadata: {exc}") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict):
        raise CheckpointError(f"{path}: not a checkpoint's metadata")
    return meta


def check_dcp(folder: Path) -> None:
    """Every file DCP will unpickle in ``folder`` holds data only; CheckpointError naming
    the first that does not (or that lies outside the folder)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    meta = read_metadata(folder)
    for index, info in meta.storage_data.items():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise CheckpointError(f"{folder / METADATA_NAME}: names a shard file {name!r} "
                                  "outside the checkpoint folder")
        kind = meta.state_dict_metadata.get(getattr(index, "fqn", None))
        if not isinstance(kind, BytesStorageMetadata):
            continue  # a tensor: DCP loads it with weights_only=True
        if getattr(info, "transform_descriptors", None):
            raise CheckpointError(f"{folder / name}: {index.fqn} is stored transformed "
                                  f"({', '.join(map(str, info.transform_descriptors))}), "
                                  "which this trainer does not write")
        offset, length = int(info.offset), int(info.length)
        if not 0 <= length <= VALUE_BYTES or offset < 0:
            raise CheckpointError(f"{folder / name}: {index.fqn} spans {length} bytes")
        with _reading(folder / name):
            data = read_range(folder / name, offset, length, follow=False)
        try:
            with warnings.catch_warnings():  # torch warns of a protocol it then reads
                warnings.simplefilter("ignore")
                torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
            raise CheckpointError(f"{folder / name}: {index.fqn} is not plain data: "
                                  f"{_first_sentence(exc)}") from None


def _first_sentence(exc: BaseException) -> str:
    """Why torch's weights-only load refused: the paragraph naming what it met ("Trying
    to load unsupported GLOBAL posix.mknod ..."), else the first sentence; never its
    advice to load with weights_only=False."""
    paragraphs = [" ".join(p.split()) for p in str(exc).split("\n\n") if p.strip()]
    named = [p for p in paragraphs if "GLOBAL" in p or "Unsupported" in p]
    text = (named or paragraphs or [type(exc).__name__])[0]
    return text.split(". ")[0].removesuffix(".")
