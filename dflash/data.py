"""Training data: JSONL rows to token examples (batching them: :mod:`dflash.batching`).

Each non-blank line of a JSONL file is one JSON object in one of these formats (the
first key found, in this order, decides; other keys are ignored):

1. ``{"input_ids": [...], "loss_mask": [...]}``: pre-tokenized; ``loss_mask`` is required.
2. ``{"prompt_ids": [...], "response_ids": [...]}``: loss on the response (``dflash-generate``).
3. ``{"messages": [{"role": ..., "content": ...}, ...]}``: the tokenizer's chat template;
   loss exactly on the tokens the assistant turns add.
4. ``{"prompt": "...", "response": "..."}``: raw completion; the prompt is encoded with the
   tokenizer's special tokens (BOS), the response without, plus ``eos_token_id`` if any.
5. ``{"text": "..."}``: plain text, encoded with special tokens; loss on *every* token.

Formats 3-5 need a tokenizer. Errors are :class:`DataError` with ``FILE:LINE: reason``.

Any row may name where it comes from with ``"source"`` (the file a prompt was cut from)
or ``"prompt_id"`` (a string or an int): the trainer holds out whole sources, never a
row whose source also trains (:mod:`dflash.heldout`), and ``dflash-generate`` copies these
keys from a prompts file into the rows it writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash.errors import DataError
from dflash.reading import lines
from envguard.atomic import write_text_atomic

MAX_TOKEN_ID = 2**31 - 1
FORMATS = ("input_ids", "prompt_ids", "messages", "prompt", "text")
SOURCE_KEYS = ("source", "prompt_id")
"""A row's origin, the first of these keys it has."""
_FORMAT_HELP = ("input_ids+loss_mask, prompt_ids+response_ids, messages, prompt+response, "
                "text")


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            }.get(type(value), "number")


def _check_ids(name: str, values: Sequence[Any], *, mask: bool = False) -> None:
    """Raise ValueError naming the first value that is not a token id (or 0/1 for a mask)."""
    if values and set(map(type, values)) == {int} and (
            set(values) <= {0, 1} if mask else min(values) >= 0 and max(values) <= MAX_TOKEN_ID):
        return  # the fast path, in C; the loop below finds the offender
    for i, x in enumerate(values):
        if type(x) is not int:
            raise ValueError(f"{name}[{i}] is {short_repr(x)}, not an int")
        if mask and x not in (0, 1):
            raise ValueError(f"{name}[{i}] is {x}; a loss mask holds 0 or 1")
        if not 0 <= x <= MAX_TOKEN_ID:
            raise ValueError(f"{name}[{i}] is {short_repr(x)}; token ids are in [0, 2**31)")


@dataclass(frozen=True, slots=True)
class Example:
    """One training sequence; ``loss_mask`` is 1 on trained (response) tokens."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    source: str | None = None
    """Where the row comes from (``source:FILE``, ``prompt_id:ID``); None: not said."""

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("an example needs at least one token")
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"input_ids has {len(self.input_ids)} tokens but loss_mask has "
                             f"{len(self.loss_mask)}")
        _check_ids("input_ids", self.input_ids)
        _check_ids("loss_mask", self.loss_mask, mask=True)


# -- reading ------------------------------------------------------------------------------
def _rows(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ("FILE:LINE", object) for every non-blank line."""
    p = Path(path)
    for lineno, raw in lines(p, DataError):  # a regular file only, each line bounded
        where = f"{p}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not UTF-8 (byte {exc.start + 1} of the line)") from None
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})"
                            ) from None
        except RecursionError:
            raise DataError(f"{where}: malformed JSON: nested too deeply") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object, got {_json_type(row)}")
        yield where, row


def _kind(row: dict[str, Any]) -> str:
    for key in FORMATS:
        if key in row:
            return key
    keys = ", ".join(short_repr(k, 24) for k in list(row)[:6]) or "none"
    raise ValueError(f"unknown row format (keys: {keys}); expected one of: {_FORMAT_HELP}")


def _field(row: dict[str, Any], key: str, kind: type) -> Any:
    if key not in row:
        raise ValueError(f"this row format needs {key!r}")
    if type(row[key]) is not kind:
        what = "a string" if kind is str else "an array of ints"
        raise ValueError(f"{key!r} must be {what}, got {_json_type(row[key])}")
    return row[key]


def _ids(row: dict[str, Any], key: str, *, mask: bool = False) -> list[int]:
    value: list[int] = _field(row, key, list)
    _check_ids(repr(key), value, mask=mask)
    return value


def _messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("'messages' must be a non-empty array of objects")
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise ValueError(f"messages[{i}] must be an object with string 'role' and 'content'")
    return msgs


def _call(tokenizer: Any | None, kind: str, method: str, *args: Any, **kwargs: Any) -> list[int]:
    """Call a tokenizer method and return its token ids as a checked list."""
    if tokenizer is None:
        raise ValueError(f"{kind!r} rows need a tokenizer (a --target with a tokenizer)")
    try:
        out = getattr(tokenizer, method)(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a template's own error becomes one DataError line
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"tokenizer {method} failed: {short_repr(first, 120)}") from None
    if isinstance(out, Mapping):  # a BatchEncoding (transformers >= 5 returns a dict)
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    ids = list(out)
    _check_ids(f"tokenizer {method} output", ids)
    return ids


def _template(tokenizer: Any | None, msgs: list[dict[str, Any]], gen: bool) -> list[int]:
    return _call(tokenizer, "messages", "apply_chat_template", msgs, tokenize=True,
                 add_generation_prompt=gen)


def _chat_example(tokenizer: Any | None, msgs: list[dict[str, Any]]) -> tuple[list[int],
                                                                               list[int]]:
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if not turns:
        raise ValueError("'messages' has no assistant message to train on")
    final = _template(tokenizer, msgs, False)
    mask = [0] * len(final)
    for i in turns:
        prefix = _template(tokenizer, msgs[:i], True)
        full = final if i == len(msgs) - 1 else _template(tokenizer, msgs[: i + 1], False)
        if full[: len(prefix)] != prefix or final[: len(full)] != full:
            raise ValueError(f"the chat template renders messages[{i}] differently once "
                             "later messages follow; put each assistant turn in its own row")
        mask[len(prefix): len(full)] = [1] * (len(full) - len(prefix))
    return final, mask


def _pretokenized(row: dict[str, Any]) -> tuple[list[int], list[int]]:
    ids, mask = _ids(row, "input_ids"), _ids(row, "loss_mask", mask=True)
    if len(ids) != len(mask):
        raise ValueError(f"'input_ids' has {len(ids)} tokens but 'loss_mask' has {len(mask)}")
    return ids, mask


def _example_row(row: dict[str, Any], tokenizer: Any | None) -> tuple[list[int], list[int]]:
    kind = _kind(row)
    if kind == "input_ids":
        return _pretokenized(row)
    if kind == "prompt_ids":
        prompt, response = _ids(row, "prompt_ids"), _ids(row, "response_ids")
        return prompt + response, [0] * len(prompt) + [1] * len(response)
    if kind == "messages":
        return _chat_example(tokenizer, _messages(row))
    if kind == "prompt":
        prompt_text, response_text = _field(row, "prompt", str), _field(row, "response", str)
        prompt = _call(tokenizer, kind, "encode", prompt_text, add_special_tokens=True)
        response = _call(tokenizer, kind, "encode", response_text, add_special_tokens=False)
        eos = getattr(tokenizer, "eos_token_id", None)
        if type(eos) is int:
            response.append(eos)
        return prompt + response, [0] * len(prompt) + [1] * len(response)
    ids = _call(tokenizer, kind, "encode", _field(row, "text", str), add_special_tokens=True)
    return ids, [1] * len(ids)


def _prompt_row(row: dict[str, Any], tokenizer: Any | None) -> list[int]:
    kind = _kind(row)
    if kind == "input_ids":
        if "loss_mask" not in row:
            return _ids(row, "input_ids")
        ids, mask = _pretokenized(row)
        return ids[: next((i for i, m in enumerate(mask) if m), len(mask))]
    if kind == "prompt_ids":
        return _ids(row, "prompt_ids")
    if kind == "messages":
        msgs = _messages(row)
        if msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]
        if not msgs:
            raise ValueError("'messages' has nothing before the final assistant message")
        return _template(tokenizer, msgs, True)
    return _call(tokenizer, kind, "encode", _field(row, kind, str), add_special_tokens=True)


def _origin(row: dict[str, Any]) -> dict[str, str | int]:
    """The row's first :data:`SOURCE_KEYS` entry, checked ({} when it has none)."""
    for key in SOURCE_KEYS:
        if key in row:
            value = row[key]
            if not ((type(value) is str and value) or type(value) is int):
                raise ValueError(f"{key!r} must be a non-empty string or an int, got "
                                 f"{short_repr(value)}")
            return {key: value}
    return {}


def source_of(row: dict[str, Any]) -> str | None:
    """``KEY:VALUE`` of the row's origin (:func:`_origin`), None when it names none."""
    origin = _origin(row)
    return next((f"{k}:{v}" for k, v in origin.items()), None)


def read_origins(path: str | Path) -> list[dict[str, str | int]]:
    """Each row's origin key and value ({} for none), for ``dflash-generate`` to copy."""
    origins = []
    for where, row in _rows(path):
        try:
            origins.append(_origin(row))
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None
    return origins


def _in_vocabulary(ids: Sequence[int], vocab_size: int | None) -> None:
    """Every id is a row of the target's embedding: a file tokenized for another model
    is one line naming the id, not an IndexError deep in the first forward."""
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise ValueError(f"token id {max(ids)} is outside the target's vocabulary "
                         f"({vocab_size} ids): tokenized for another model?")


def read_examples(path: str | Path, *, tokenizer: Any | None = None,
                  max_length: int, vocab_size: int | None = None) -> list[Example]:
    """Every row as an Example, cut to its first ``max_length`` tokens (even if that leaves
    no loss tokens: :func:`drop_short` removes those); with ``vocab_size``, every id of a
    row must be below it."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    examples = []
    for where, row in _rows(path):
        try:
            ids, mask = _example_row(row, tokenizer)
            if not ids:
                raise ValueError("the row has no tokens")
            _in_vocabulary(ids, vocab_size)
            examples.append(Example(tuple(ids[:max_length]), tuple(mask[:max_length]),
                                    source_of(row)))
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def read_prompts(path: str | Path, *, tokenizer: Any | None = None,
                 vocab_size: int | None = None) -> list[list[int]]:
    """The prompt of every row: prompt_ids, the leading loss_mask==0 run of input_ids (all of
    it without a loss_mask), the chat up to a final assistant message plus the generation
    prompt, ``prompt``, or the whole ``text``; with ``vocab_size``, every id below it."""
    prompts = []
    for where, row in _rows(path):
        try:
            prompt = _prompt_row(row, tokenizer)
            _in_vocabulary(prompt, vocab_size)
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None
        if not prompt:
            raise DataError(f"{where}: empty prompt")
        prompts.append(list(prompt))
    if not prompts:
        raise DataError(f"{path}: no examples")
    return prompts


def drop_short(examples: list[Example], min_loss_tokens: int) -> list[Example]:
    """The examples with at least ``min_loss_tokens`` loss tokens, in order."""
    return [ex for ex in examples if sum(ex.loss_mask) >= min_loss_tokens]


def write_jsonl_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line, atomically (raises envguard's OutputError)."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in records)
    write_text_atomic(path, text)
