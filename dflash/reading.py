"""Reading what a user names: a data or prompts file, a model or drafter folder.

The same rules as envguard's inputs (:mod:`envguard.input_file`, the one mechanism): a
regular file only, so a FIFO cannot hang a command and ``/dev/zero`` cannot fill its
memory; a JSON document at most :data:`JSON_BYTES`; a line of a JSONL file at most
:data:`LINE_BYTES`. Symlinks are followed (a Hugging Face cache's snapshot is a folder of
links to blobs). A folder that a library opens file by file itself (transformers'
config and tokenizer, safetensors' weights) is checked first with :func:`check_folder`,
a ``stat`` of each entry, which opens nothing. Every refusal is the caller's
one-line :class:`~dflash.errors.InputError` subclass (exit 2) naming the file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dflash.errors import InputError
from envguard.input_file import (
    METADATA_BYTES,
    NotReadable,
    not_regular,
    open_stream,
    read_bounded_text,
    read_range,
)

JSON_BYTES = METADATA_BYTES
"""16 MiB: a config.json, tokenizer_config.json, generation_config.json or weight index
(the largest of these in common checkpoints is a tokenizer_config.json of a few MB)."""
LINE_BYTES = 256 << 20
"""256 MiB: one line of a data or prompts file (a 1M-token row is about 8 MB of JSON)."""


def read_text(path: Path, error: type[InputError], what: str = "file") -> str:
    """The text of the regular file ``path`` (at most :data:`JSON_BYTES`); FileNotFoundError
    when it is not there, ``error`` when it cannot be read."""
    try:
        return read_bounded_text(path, limit=JSON_BYTES, what=what)
    except NotReadable as exc:
        raise error(str(exc)) from None


def read_json(path: Path, error: type[InputError], what: str = "JSON document") -> Any:
    """:func:`read_text` parsed as JSON; ``error`` naming the file when it is not JSON."""
    text = read_text(path, error, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{path} is not JSON: nested too deeply") from None


def lines(path: Path, error: type[InputError]) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) for each line of the regular file ``path``, newline included;
    ``error`` when it is missing, not a regular file, unreadable, or has a line longer than
    :data:`LINE_BYTES`."""
    with _stream(path, error) as fh:
        lineno = 0
        try:
            while raw := fh.readline(LINE_BYTES + 1):
                lineno += 1
                if len(raw) > LINE_BYTES:
                    raise error(f"{path}:{lineno}: a line longer than {LINE_BYTES:,} bytes")
                yield lineno, raw
        except OSError as exc:
            raise error(f"{path}: {exc.strerror or exc}") from None


def check_file(path: Path, error: type[InputError]) -> None:
    """``path`` is a regular file that opens for reading (nothing read)."""
    _stream(path, error).close()


def _stream(path: Path, error: type[InputError]) -> BinaryIO:
    """:func:`envguard.input_file.open_stream`, its refusals as ``error``."""
    try:
        return open_stream(path)
    except FileNotFoundError:
        raise error(f"{path}: No such file or directory") from None
    except NotReadable as exc:
        raise error(str(exc)) from None


MODEL_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".jinja", ".txt", ".tiktoken")
"""The files of a model folder that its loaders open: configs, weights, tokenizer files."""


def check_folder(folder: Path, error: type[InputError], *, weights: bool = True) -> None:
    """Every file of ``folder`` that a model's loaders open (:data:`MODEL_SUFFIXES`) is a
    regular file, or nothing (a dangling link is left to the loader's own message), so a
    library opening them cannot block on a FIFO or stream a device; and, where its
    ``weights`` are loaded, its config.json asks for no more layers than they hold
    (:func:`check_layers`)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return  # not a folder, or unreadable: the loader says so
    for entry in entries:
        if not entry.name.endswith(MODEL_SUFFIXES):
            continue
        reason = not_regular(entry.path)
        if reason is not None:
            raise error(f"{entry.path}: {reason}")
    if weights:
        check_layers(folder, error)


HEADER_BYTES = 100 << 20
"""100 MiB: a safetensors header (its tensor names, dtypes, shapes, offsets), safetensors'
own bound."""
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")
"""A decoder layer's index in a tensor name, as the common families name them (Llama,
Qwen, Mistral: ``layers``; BERT: ``layer``; GPT-2, Falcon, BLOOM: ``h``; others:
``blocks``)."""


def tensor_names(file: Path, error: type[InputError]) -> list[str]:
    """The tensor names of a safetensors file, from its header alone (8 bytes of length,
    then JSON): no tensor read, no torch."""
    try:
        size = int.from_bytes(read_range(file, 0, 8, follow=True), "little")
        if not 2 <= size <= HEADER_BYTES:
            raise error(f"{file}: not a safetensors file (a header of {size:,} bytes)")
        raw = read_range(file, 8, size)
        if len(raw) < size:
            raise error(f"{file}: not a whole safetensors file (its header is cut short: "
                        f"{len(raw):,} of {size:,} bytes)")
        header = json.loads(raw)
    except NotReadable as exc:
        raise error(str(exc)) from None
    except (ValueError, RecursionError):
        raise error(f"{file}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise error(f"{file}: not a safetensors file (its header is not a JSON object)")
    return [name for name in header if name != "__metadata__"]


def check_layers(folder: Path, error: type[InputError]) -> None:
    """A weights folder's config.json asks for no more decoder layers
    (``num_hidden_layers``) than its safetensors hold (``…layers.N.`` names, read from the
    index or the headers): a config edited or corrupted to 10^8 layers would otherwise be
    built layer by layer before a single weight is read. More layers in the weights than
    in the config is allowed (extra prediction layers), and weights whose layers are named
    in no way :data:`_LAYER` knows are not compared."""
    try:
        config = read_json(folder / "config.json", error, "model config")
    except FileNotFoundError:
        return
    section = config.get("text_config", config) if isinstance(config, dict) else None
    wanted = section.get("num_hidden_layers") if isinstance(section, dict) else None
    files = sorted(folder.glob("*.safetensors"))
    if not isinstance(wanted, int) or isinstance(wanted, bool) or not files:
        return
    index = folder / "model.safetensors.index.json"
    try:
        weight_map = read_json(index, error, "weight index").get("weight_map")
        names = list(weight_map) if isinstance(weight_map, dict) else []
    except (FileNotFoundError, AttributeError):
        names = []
    if not names:  # no index, or one without a usable map: the headers themselves
        names = [name for file in files for name in tensor_names(file, error)]
    held = {m.group(1) for name in names if (m := _LAYER.search(name))}
    if held and wanted > len(held):  # no layer named as we know them: nothing to compare
        raise error(f"{folder / 'config.json'} asks for {wanted} layers, its weights hold "
                    f"{len(held)}")
