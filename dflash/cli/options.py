"""The commands' shared options and the checks of their input, made before anything heavy
is imported: files that must be readable, folders and files that must be writable,
numbers in range. Each check raises a one-line :class:`~dflash.errors.InputError`
(exit 2)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from dflash.config import check_device
from dflash.errors import DataError, InputError
from dflash.presets import target_path
from dflash.reading import check_file


def readable_file(path: str | Path, error: type[InputError] = DataError) -> Path:
    """``path`` is a regular file that opens for reading (a FIFO or a device is refused,
    never waited on; :func:`dflash.reading.check_file`)."""
    p = Path(path)
    check_file(p, error)
    return p


def _writable_parent(path: Path, flag: str) -> None:
    """The nearest existing folder above ``path`` is a folder we may write into."""
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: cannot write in {parent}")


def output_folder(path: str | Path, flag: str) -> Path:
    """A folder to write into: an existing folder, or one that can be made."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag} {p}: is a file, not a folder")
    if not p.exists():
        _writable_parent(p, flag)
    return p


def output_file(path: str | Path, flag: str) -> Path:
    """A file to write (atomically, so into its folder): not a folder, its folder writable."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {p}: is a folder, not a file")
    _writable_parent(p, flag)
    return p


def at_least(flag: str, value: float | None, low: float) -> None:
    """``value`` (None: not given) is a finite number, at least ``low``."""
    if value is not None and not math.isfinite(value):  # NaN is not below anything
        raise InputError(f"{flag} must be a finite number, got {value:g}")
    if value is not None and value < low:
        raise InputError(f"{flag} must be >= {low:g}, got {value:g}")


def add_decoding_options(p: argparse.ArgumentParser, *, prompts_required: bool = True
                         ) -> None:
    """What dflash-generate and dflash-eval both take: the target, where the prompts come
    from (``prompts_required=False``: :func:`check_decoding_options` asks for them when
    the command needs them), and the device."""
    p.add_argument("--target", required=True,
                   help="local HF model folder/config, or a named shape (tiny, ...)")
    src = p.add_mutually_exclusive_group(required=prompts_required)
    src.add_argument("--prompts", metavar="FILE", help="JSONL prompts (any dflash.data format)")
    src.add_argument("--synthetic", type=int, metavar="N", help="N random-token prompts")
    p.add_argument("--prompt-length", type=int, default=16, help="for --synthetic")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")


def check_decoding_options(args: argparse.Namespace) -> None:
    """The options of :func:`add_decoding_options`, and ``--max-new-tokens``."""
    target_path(args.target)
    if args.prompts:
        readable_file(args.prompts)
    elif args.synthetic is None:
        raise InputError("one of --prompts or --synthetic is required")
    else:
        at_least("--synthetic", args.synthetic, 1)
        at_least("--prompt-length", args.prompt_length, 1)
    at_least("--max-new-tokens", args.max_new_tokens, 1)
    check_device(args.device, "--device")
