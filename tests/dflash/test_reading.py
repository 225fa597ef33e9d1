"""What a user names is read as envguard reads its inputs (:mod:`dflash.reading`): regular
files only, a FIFO refused at once, never waited on, a device never streamed, a line
bounded. The commands' one-line refusals are in tests/dflash/test_cli.py; here the
functions, and a model folder whose files a library would have opened itself."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dflash import reading
from dflash.data import read_examples
from dflash.errors import DataError, TargetError
from envguard.input_file import NotReadable, not_regular, open_stream


def test_a_fifo_or_a_device_is_refused_at_once_and_a_regular_file_streams(tmp_path: Path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with pytest.raises(NotReadable, match="is a FIFO, not a regular file"):
        open_stream(fifo)
    with pytest.raises(NotReadable, match="is a character device"):
        open_stream("/dev/zero")
    with pytest.raises(NotReadable, match="is a folder"):
        open_stream(tmp_path)
    with pytest.raises(FileNotFoundError):
        open_stream(tmp_path / "missing")
    assert time.perf_counter() - started < 5
    text = tmp_path / "t.jsonl"
    text.write_bytes(b"a\nb\n")
    with open_stream(text) as fh:
        assert fh.read() == b"a\nb\n"
    assert not_regular(fifo) == "is a FIFO, not a regular file"
    assert not_regular(text) is None and not_regular(tmp_path / "missing") is None


def test_a_line_past_the_bound_is_one_error_naming_it(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reading, "LINE_BYTES", 16)
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "ok"}\n' + '{"text": "' + "x" * 40 + '"}\n')
    walk = reading.lines(data, DataError)
    assert next(walk) == (1, b'{"text": "ok"}\n')  # line by line: the first is read whole
    with pytest.raises(DataError, match=r"train\.jsonl:2: a line longer than 16 bytes"):
        list(reading.lines(data, DataError))


def test_the_data_reader_refuses_a_fifo_in_one_line(tmp_path: Path):
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"train\.jsonl: is a FIFO"):
        read_examples(fifo, max_length=64)


def test_a_model_folder_whose_loader_would_block_is_refused_before_loading(tmp_path: Path):
    """The tiny shape's config as a target folder: the random model loads; a FIFO where
    its tokenizer.json belongs is refused before transformers would open it, a FIFO under
    a name no loader opens is left alone, and so is a subfolder."""
    from dflash.presets import TARGET_SHAPES
    from dflash.target import _qwen3_config, load_target, transformers_config

    folder = tmp_path / "model"
    folder.mkdir()
    config = transformers_config(_qwen3_config(TARGET_SHAPES["tiny"]))
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    os.mkfifo(folder / "notes.fifo")
    (folder / "subfolder").mkdir()
    assert load_target(str(folder)).vocab_size == config.vocab_size
    os.mkfifo(folder / "tokenizer.json")
    started = time.perf_counter()
    with pytest.raises(TargetError, match=r"tokenizer\.json: is a FIFO, not a regular file"):
        load_target(str(folder))
    assert time.perf_counter() - started < 5
    (folder / "tokenizer.json").unlink()
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with pytest.raises(TargetError, match=r"config\.json: is a FIFO"):
        load_target(str(folder))


def _weights(folder: Path, layers: int, config_layers: int) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"model.layers.{i}.mlp.weight": torch.zeros(2) for i in range(layers)}
              | {"model.embed_tokens.weight": torch.zeros(4, 2)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "qwen3", "num_hidden_layers": config_layers}))


def test_a_config_asking_for_more_layers_than_its_weights_hold_is_refused(tmp_path: Path):
    """Read from the safetensors header alone (or the index): a config edited to 10^8
    layers is refused before a model is built; extra layers in the weights are allowed."""
    _weights(tmp_path / "ok", layers=3, config_layers=3)
    reading.check_layers(tmp_path / "ok", TargetError)
    _weights(tmp_path / "extra", layers=3, config_layers=2)  # a prediction layer beyond
    reading.check_layers(tmp_path / "extra", TargetError)
    _weights(tmp_path / "edited", layers=3, config_layers=100_000_000)
    with pytest.raises(TargetError, match=r"config\.json asks for 100000000 layers, its "
                                          r"weights hold 3"):
        reading.check_layers(tmp_path / "edited", TargetError)
    started = time.perf_counter()
    from dflash.target import load_target

    with pytest.raises(TargetError, match="asks for 100000000 layers"):
        load_target(str(tmp_path / "edited"))
    assert time.perf_counter() - started < 10
    index = tmp_path / "edited" / "model.safetensors.index.json"  # sharded: names from it
    index.write_text(json.dumps({"weight_map": {
        f"model.layers.{i}.mlp.weight": "model.safetensors" for i in range(10)
    }}))
    with pytest.raises(TargetError, match=r"weights hold 10$"):
        reading.check_layers(tmp_path / "edited", TargetError)


def test_a_config_file_named_is_built_without_its_folders_weights(tmp_path: Path):
    """``--target folder/small.json`` builds random weights from that file: the folder's
    own config.json and weights are not what loads, so they are not compared."""
    from dflash.target import load_target

    _weights(tmp_path / "edited", layers=3, config_layers=100_000_000)
    small = tmp_path / "edited" / "small.json"
    small.write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8}))
    assert len(load_target(str(small)).layers) == 12
    with pytest.raises(TargetError, match="asks for 100000000 layers"):
        load_target(str(tmp_path / "edited"))


def test_a_safetensors_header_that_lies_is_one_line(tmp_path: Path):
    folder = tmp_path / "m"
    _weights(folder, layers=1, config_layers=1)
    (folder / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(TargetError, match=r"not a safetensors file \(a header of "):
        reading.check_layers(folder, TargetError)
    (folder / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"{no}")
    with pytest.raises(TargetError, match="its header is not JSON"):
        reading.check_layers(folder, TargetError)


def test_layers_named_otherwise_are_counted_or_left_alone(tmp_path: Path):
    """GPT-2 and Falcon name a layer ``h.N``: counted; a family named in no known way is
    not compared (no false refusal); an index without a map falls back to the headers."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "falcon"
    folder.mkdir()
    save_file({f"transformer.h.{i}.mlp.weight": torch.zeros(1) for i in range(2)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 3}))
    with pytest.raises(TargetError, match="asks for 3 layers, its weights hold 2"):
        reading.check_layers(folder, TargetError)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(TargetError, match="asks for 3 layers, its weights hold 2"):
        reading.check_layers(folder, TargetError)
    odd = tmp_path / "odd"
    odd.mkdir()
    save_file({"stack.0.weight": torch.zeros(1)}, str(odd / "model.safetensors"))
    (odd / "config.json").write_text(json.dumps({"num_hidden_layers": 48}))
    reading.check_layers(odd, TargetError)
